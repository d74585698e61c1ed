// Package firecracker is forkd's VMM driver for Firecracker microVMs on
// KVM hosts, registered as "firecracker".
//
// It is contract-tested, not yet run: these build hosts have no /dev/kvm
// and no firecracker binary. The tests run the driver against fctest, a
// fake API server that checks every request against Firecracker's own
// API description (firecracker.yaml, version 1.17.0-dev) and keeps its
// state machine. They prove the requests, not a booted VM.
//
// # The API client
//
// The client is small and hand-written (api.go): about twenty request
// types over net/http on the Unix socket. firecracker-go-sdk is not
// served by the module proxy these builds use (403), and would bring a
// generated go-swagger client, logrus and a Machine that owns its VMM
// through the caller's context, which the vmm contract rules out. An
// error answer becomes an *APIError carrying Firecracker's fault_message
// and an errdefs class: FailedPrecondition for a request the microVM's
// state does not allow, InvalidArgument for other 400s, Internal for
// server errors, Unavailable when the socket does not answer.
//
// # Machines
//
// Boot starts the VMM (under the jailer unless Config.NoJailer), waits
// for the API socket, then sets machine-config (vCPUs, memory,
// track_dirty_pages), boot-source, the read-only root drive, an optional
// per-child writable layer (Config.LayerMiB), the NIC on the tap in the
// child's network namespace, vsock and an entropy device, and sends
// InstanceStart.
//
// Prepare only starts a process: Firecracker takes snapshot/load only as
// a fresh process's first configuration, so the load is Restore's one
// request, with the memory file mapped MAP_PRIVATE (mem_backend File:
// copy-on-write children) or served by a page server (Uffd), this
// child's tap (network_overrides) and vsock socket (vsock_override),
// and kvmclock advanced to now (clock_realtime).
//
// Snapshot pauses (PATCH /vm), has Firecracker write the state and
// memory files (Full, or Diff with dirty-page tracking), syncs them and
// resumes or ends the guest.
//
// The agent is reached over Firecracker's hybrid vsock: the host end is
// a Unix socket where a connection writes "CONNECT <port>\n" and reads
// "OK <n>\n" before the stream starts.
//
// # The jailer
//
// With the jailer (the default; needs root) every Firecracker runs
// chrooted in <ChrootBase>/firecracker/<id>/root as Config.UID/GID, in a
// cgroup v2 group and the child's network namespace. Files it needs are
// hard-linked into the chroot (same file system as ChrootBase);
// snapshots it writes are moved out.
package firecracker

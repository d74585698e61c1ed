// Package fakevmm is an in-process stand-in for a VMM driver, for tests
// that need machines without QEMU, root or a guest kernel. The VMM
// conformance suite (internal/vmm/vmmtest) runs against it in every
// `make unit`, so the suite's own logic is exercised on every host, and
// the fake is held to the same contract as the real drivers.
//
// It is not a virtual machine. A machine is a pair of goroutines in the
// test process that answer testguest's line protocol (ping, set, get; see
// internal/testutil/testguest) on an in-process agent channel (net.Pipe).
// What it keeps real is what the suite checks about a driver:
//
//   - Guest memory is a real mapping, and "set" stores its value in it.
//     Boot with MachineConfig.MemoryFile maps that file shared, so the
//     file is the template's memory image (as QEMU templating); without
//     one, guest memory is anonymous. Prepare and Restore map a
//     snapshot's memory file private (MAP_PRIVATE): children share its
//     pages copy-on-write, and a child's writes never reach the file. "A
//     child sees its template's value, two children diverge" is therefore
//     a statement about these mappings.
//   - The guest's writes mark pages dirty. A diff snapshot writes those
//     pages, as a complete image or a sparse layer, and lists them in a
//     page index (package memlayer).
//   - Snapshot files are staged, fsynced and renamed into place. Restore
//     reads the state file back: a missing one fails with an
//     errdefs.ErrNotFound-class error, a corrupt or mismatched one with
//     errdefs.ErrInvalidArgument, and a failed restore ends the machine.
//   - Pause stops the guest between two commands: a line sent meanwhile
//     waits in the channel, as in a serial port's buffer, and is answered
//     after Resume.
//   - Adopt: the machines live in a process-wide registry keyed by run
//     directory, which stands in for the VMM processes that outlive a
//     daemon. A new Driver (a "restarted daemon") takes a machine over
//     from its identity; Machine.Detach lets go of one as a dying daemon
//     does.
//
// What it lacks: processes, devices and a kernel. PID is the test
// process's own (never signal it), and ProcessIdentity's StartTime is a
// serial number per machine; so it offers no vmm.Lister, whose callers
// kill the PIDs it returns. Boot checks that the image's kernel is a
// non-empty regular file and never reads it. There is no network, disk,
// vmgenid or CPU limit, and no live snapshot. Kill and Stop end a machine
// once a snapshot that is writing its memory has finished. The driver is
// not registered in the vmm registry: a daemon cannot select it.
package fakevmm

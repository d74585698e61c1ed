// Package agentconn is the transport between forkd (the host) and forkd-agent
// (the guest): a line handshake followed by yamux, with HTTP/1.1 on every
// yamux stream. See package agentapi for the wire contract.
//
// The guest side (Serve) is written for a virtio-serial port, whose
// properties shape the design:
//
//   - A read returns 0 bytes (EOF) while no host is connected, and keeps
//     doing so until one connects. EOF therefore means "host gone", never
//     "port closed": the agent backs off briefly and keeps reading. An EOF
//     does not end a session: the guest can learn of a host's disconnect
//     after the next host's first bytes (a slow guest handles the port's
//     "closed" notice late), and ending the session then would drop the new
//     host's frames with no sign to the host. The next host's HELLO ends the
//     session instead, as below.
//   - The port lives as long as the VM, across many hosts: the template's
//     builder, then one host per restored child, possibly a restarted host.
//     A session must never close the port.
//   - A VM restored from a snapshot resumes wherever the agent was, possibly
//     inside a session with a host that no longer exists. The new host sends
//     its HELLO as raw bytes onto that stale session.
//
// So one goroutine owns all reads of the port for the life of the agent, and
// yamux never reads the port itself: the agent parses the yamux frame
// headers as they go by and feeds whole, valid frames to the current yamux
// session through a pipe. A header that is not valid yamux (a HELLO line
// begins with 'F', and every yamux header with a zero version byte) ends the
// session, and the bytes from that header on are scanned for a HELLO, so a
// HELLO that arrives in the same read as stale frames is not lost.
//
// A HELLO is recognised at a yamux frame boundary (or while awaiting one).
// An agent whose host stopped in the middle of writing a frame (a VM
// snapshotted then, or a daemon killed mid-write) waits for the rest of that
// frame and takes the new HELLO for payload. Dial therefore resynchronizes when no
// READY comes within a second: it sends zeros longer than any frame the
// agent accepts (completing the stale frame; a zero header is invalid, which
// ends the session) and the HELLO again, with a new nonce so it skips a
// READY for the first one.
//
// The host side (Dial) runs yamux directly over its net.Conn (a Unix socket
// to QEMU's chardev), since a host connection serves one session only.
//
// The guest runs untrusted code as root and its agent can be replaced, so
// the host bounds what it takes from it. The host is the yamux client and
// only opens streams: it sends a GoAway right after the handshake, and
// yamux then resets every stream the guest opens, dropping its data
// (unaccepted streams would each hold up to 256 KiB of host memory). Each
// host-opened stream buffers at most streamWindow, a handshake line is at
// most maxHandshakeLine, and response headers at most maxResponseHeader;
// package agentclient bounds the response bodies.
package agentconn

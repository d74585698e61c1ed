// Package qmp is a small client for the QEMU Machine Protocol: JSON
// commands and replies over a unix socket, plus asynchronous events.
//
// A Client is connected with Dial, which retries until the socket accepts
// (QEMU creates it shortly after it starts), reads the greeting and leaves
// capability negotiation mode. Execute is safe for concurrent use: every
// command carries an "id" and its reply is matched by that id, so events and
// replies to other callers never confuse each other. Events go to
// subscribers (Subscribe), never to Execute.
//
// ExecuteWithFiles passes file descriptors along with a command (SCM_RIGHTS),
// which is how QMP's getfd and add-fd receive them.
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ErrClosed is returned by calls on a client whose connection has ended.
var ErrClosed = errors.New("qmp: connection closed")

// MaxLineBytes bounds one message (one line) from QEMU. The largest reply
// QEMU has, query-qmp-schema, is about 200 KiB in QEMU 7.2, and the replies
// forkd asks for (query-status, query-migrate, HMP "info ramblock") are a
// few KiB: a longer line comes from a QEMU that misbehaves, or that a guest
// has taken over, and must not make the daemon buffer it without bound.
const MaxLineBytes = 1 << 20

// Error is an error reply from QEMU.
type Error struct {
	Command string // the command that failed
	Class   string // e.g. "GenericError", "CommandNotFound"
	Desc    string // QEMU's human-readable description
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Event is an asynchronous QMP event.
type Event struct {
	Name string          // e.g. "STOP", "RESUME", "MIGRATION", "SHUTDOWN"
	Data json.RawMessage // the event's "data" member, if any
	Time time.Time       // QEMU's timestamp
}

// Version is QEMU's version from the greeting.
type Version struct {
	Major, Minor, Micro int
	Package             string
}

func (v Version) String() string {
	return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
}

// Client is a connected QMP session.
type Client struct {
	conn    *net.UnixConn
	version Version
	done    chan struct{} // closed when the read loop ends

	wmu sync.Mutex // serialises writes (a command and its fds are one message)

	// mu guards the fields below.
	mu       sync.Mutex
	nextID   uint64
	pending  map[string]chan reply
	order    []string // ids in send order, for replies that lack an id
	subs     map[*subscription]struct{}
	readErr  error
	closeErr error
	closed   bool
	broken   error // why the client closed the connection itself
}

type reply struct {
	ret json.RawMessage
	err *Error
}

// wire is any message QEMU sends.
type wire struct {
	QMP *struct {
		Version struct {
			QEMU struct {
				Major int `json:"major"`
				Minor int `json:"minor"`
				Micro int `json:"micro"`
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
	} `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	ID        json.RawMessage `json:"id"`
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// Dial connects to the QMP socket at path, retrying while the socket does
// not exist or refuses connections, until ctx ends. It then reads the
// greeting and sends qmp_capabilities.
func Dial(ctx context.Context, path string) (*Client, error) {
	conn, err := dialRetry(ctx, path)
	if err != nil {
		return nil, err
	}
	c, err := newClient(ctx, conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func dialRetry(ctx context.Context, path string) (*net.UnixConn, error) {
	var d net.Dialer
	wait := time.Millisecond
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn.(*net.UnixConn), nil
		}
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("qmp: dial %s: %w (last error: %v)", path, context.Cause(ctx), err)
		case <-t.C:
		}
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// newClient reads the greeting from conn and negotiates capabilities.
func newClient(ctx context.Context, conn *net.UnixConn) (*Client, error) {
	c := &Client{
		conn:    conn,
		done:    make(chan struct{}),
		pending: map[string]chan reply{},
		subs:    map[*subscription]struct{}{},
	}
	r := bufio.NewReaderSize(conn, 64<<10)
	// The greeting is read synchronously, bounded by ctx.
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	line, err := readLine(r)
	if !stop() {
		return nil, fmt.Errorf("qmp: greeting: %w", context.Cause(ctx))
	}
	if err != nil {
		return nil, fmt.Errorf("qmp: greeting: %w", err)
	}
	var g wire
	if err := json.Unmarshal(line, &g); err != nil || g.QMP == nil {
		return nil, fmt.Errorf("qmp: unexpected greeting %q", truncate(line, 200))
	}
	v := g.QMP.Version
	c.version = Version{v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro, v.Package}
	go c.readLoop(r)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Version is the QEMU version announced in the greeting.
func (c *Client) Version() Version { return c.version }

// Done is closed when the connection has ended (Close, QEMU exited, a
// command was cut off part-way, or QEMU sent a line over MaxLineBytes).
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the session. Pending calls fail with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		<-c.done
		return c.closeErr
	}
	c.closed = true
	c.closeErr = c.conn.Close()
	c.mu.Unlock()
	<-c.done
	return c.closeErr
}

// Execute runs a command and decodes its "return" member into result
// (which may be nil). args is marshalled as "arguments" unless nil. An error
// reply is returned as *Error. If ctx ends first the call returns the
// context's error; QEMU may still run the command. A command that ctx cuts
// off part-way (QEMU not reading) ends the session: later calls fail with
// ErrClosed.
func (c *Client) Execute(ctx context.Context, cmd string, args, result any) error {
	return c.ExecuteWithFiles(ctx, cmd, args, result)
}

// ExecuteWithFiles is Execute that also passes files' descriptors with the
// command (SCM_RIGHTS), e.g. for getfd. The caller keeps ownership of the
// files; QEMU receives duplicates.
func (c *Client) ExecuteWithFiles(ctx context.Context, cmd string, args, result any, files ...*os.File) error {
	c.mu.Lock()
	if c.readErr != nil || c.closed {
		err := c.closedErr()
		c.mu.Unlock()
		return err
	}
	c.nextID++
	id := strconv.FormatUint(c.nextID, 10)
	ch := make(chan reply, 1)
	c.pending[id] = ch
	c.order = append(c.order, id)
	c.mu.Unlock()

	msg := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{cmd, args, id}
	buf, err := json.Marshal(msg)
	if err != nil {
		c.forget(id)
		return fmt.Errorf("qmp %s: marshal arguments: %w", cmd, err)
	}
	buf = append(buf, '\n')
	if n, err := c.write(ctx, buf, files); err != nil {
		c.unsend(id)
		if n > 0 {
			// Part of the command is on the stream: QEMU would read the
			// next command as its continuation, so no later one could be
			// trusted.
			c.abandon(fmt.Errorf("%s cut off after %d of %d bytes", cmd, n, len(buf)))
		}
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}

	select {
	case r, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.closedErr()
			c.mu.Unlock()
			return fmt.Errorf("qmp %s: %w", cmd, err)
		}
		if r.err != nil {
			r.err.Command = cmd
			return r.err
		}
		if result != nil && len(r.ret) > 0 {
			if err := json.Unmarshal(r.ret, result); err != nil {
				return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		c.forget(id)
		return fmt.Errorf("qmp %s: %w", cmd, context.Cause(ctx))
	}
}

// write sends buf, with files, and says how many bytes went out. ctx
// bounds it (QEMU may have stopped reading); a write it cut off fails with
// ctx's cause.
func (c *Client) write(ctx context.Context, buf []byte, files []*os.File) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if ctx.Err() != nil {
		return 0, context.Cause(ctx)
	}
	// When ctx ends (deadline or cancel), a write deadline in the past
	// cuts the write off; the caller then gets ctx's error, not a bare
	// i/o timeout.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.conn.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	n, err := c.writeMsg(buf, files)
	if !stop() {
		<-fired // or it could cut off the next write
		c.conn.SetWriteDeadline(time.Time{})
		if err != nil {
			err = context.Cause(ctx)
		}
	}
	return n, err
}

func (c *Client) writeMsg(buf []byte, files []*os.File) (int, error) {
	if len(files) == 0 {
		return c.conn.Write(buf)
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	// The descriptors travel with the first byte; QEMU attaches them to
	// the command that this message carries. The rest, if any, follows as
	// plain data.
	n, _, err := c.conn.WriteMsgUnix(buf, syscall.UnixRights(fds...), nil)
	runtime.KeepAlive(files) // the descriptors must stay open until sent
	if err != nil || n == len(buf) {
		return n, err
	}
	m, err := c.conn.Write(buf[n:])
	return n + m, err
}

// forget drops a pending call whose reply nobody waits for.
func (c *Client) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
	// The id stays in c.order so that replies without an id (which QEMU
	// sends in order) still line up; dispatch skips forgotten ids.
}

// unsend drops a call whose command did not go out (whole).
func (c *Client) unsend(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, id)
	for i, o := range c.order {
		if o == id {
			c.order = append(c.order[:i:i], c.order[i+1:]...)
			break
		}
	}
}

// abandon closes the connection because the session cannot go on; calls
// fail with ErrClosed and the reason.
func (c *Client) abandon(reason error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.broken = reason
	c.closeErr = c.conn.Close()
}

// closedErr says why the session ended; c.mu must be held.
func (c *Client) closedErr() error {
	if c.broken != nil {
		return fmt.Errorf("%w: %v", ErrClosed, c.broken)
	}
	if c.readErr != nil && !c.closed && !errors.Is(c.readErr, net.ErrClosed) {
		return fmt.Errorf("%w: %v", ErrClosed, c.readErr)
	}
	return ErrClosed
}

func (c *Client) readLoop(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = readLine(r)
		if len(line) > 0 {
			c.dispatch(line)
		}
		if err != nil {
			break
		}
	}
	var tooLong *lineTooLongError
	if errors.As(err, &tooLong) {
		// The rest of the line would follow as the next message: nothing
		// on this connection can be trusted any more.
		c.abandon(err)
	}
	c.mu.Lock()
	c.readErr = err
	for id, ch := range c.pending {
		close(ch)
		delete(c.pending, id)
	}
	c.order = nil
	for s := range c.subs {
		s.closeLocked()
	}
	c.mu.Unlock()
	close(c.done)
}

func (c *Client) dispatch(line []byte) {
	var m wire
	if err := json.Unmarshal(line, &m); err != nil {
		return // not JSON: nothing can wait for it
	}
	if m.Event != "" {
		ev := Event{Name: m.Event, Data: m.Data}
		if m.Timestamp != nil {
			ev.Time = time.Unix(m.Timestamp.Seconds, m.Timestamp.Microseconds*1000)
		}
		c.publish(ev)
		return
	}
	if m.Return == nil && m.Error == nil {
		return
	}
	var id string
	if len(m.ID) > 0 {
		if err := json.Unmarshal(m.ID, &id); err != nil {
			return // an id we did not send
		}
	}
	rep := reply{ret: m.Return}
	if m.Error != nil {
		rep.err = &Error{Class: m.Error.Class, Desc: m.Error.Desc}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == "" {
		// QEMU omits the id only when it could not parse the command;
		// replies come in command order, so it belongs to the oldest.
		if len(c.order) == 0 {
			return
		}
		id = c.order[0]
	}
	for i, o := range c.order {
		if o == id {
			c.order = append(c.order[:i:i], c.order[i+1:]...)
			break
		}
	}
	if ch, ok := c.pending[id]; ok {
		delete(c.pending, id)
		ch <- rep
	}
}

// lineTooLongError is a message from QEMU longer than MaxLineBytes.
type lineTooLongError struct{ start []byte }

func (e *lineTooLongError) Error() string {
	return fmt.Sprintf("QEMU sent a message longer than %d bytes (qmp.MaxLineBytes), starting %q: QEMU misbehaves, or a guest has taken it over; the connection was closed",
		MaxLineBytes, e.start)
}

// readLine reads one line of at most MaxLineBytes, newline included. A
// longer one is a *lineTooLongError, found without buffering more than
// MaxLineBytes and one buffer of r.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > MaxLineBytes {
			start := line
			if len(start) == 0 {
				start = frag
			}
			return nil, &lineTooLongError{start: bytes.Clone(truncate(start, 80))}
		}
		// frag is only valid until the next read: copy it.
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

package handler

import (
	"os"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// execIO is the plumbing of one exec: the child's fds 0-2 and the agent's
// ends (output to pump, stdin to feed). With pipes, stdout and stderr are
// two pipes and stdin a pipe or /dev/null; with a terminal, fds 0-2 are
// its slave and the agent's one end is its master.
type execIO struct {
	child   [3]*os.File  // fds 0, 1, 2 of the child; closed here once it started
	ours    []*os.File   // the agent's ends, closed when the exec ends
	outputs []execOutput // what the pumps read
	stdin   *stdinPipe   // nil: stdin is /dev/null
	tty     *os.File     // the terminal's master, or nil
	spare   []*os.File   // child ends to close (the slave is in child 3 times)
}

// execOutput is one stream the pumps turn into events.
type execOutput struct {
	f   *os.File
	typ string
}

// openExecIO makes the plumbing req asks for. On error nothing is left
// open.
func openExecIO(req agentapi.ExecRequest) (x *execIO, err error) {
	x = &execIO{}
	defer func() {
		if err != nil {
			x.started()
			x.closeOurs()
		}
	}()
	if req.PTY != nil {
		master, slave, err := openPTY(*req.PTY)
		if err != nil {
			return x, err
		}
		x.tty = master
		x.ours = append(x.ours, master)
		x.child = [3]*os.File{slave, slave, slave}
		x.spare = []*os.File{slave}
		x.outputs = []execOutput{{master, agentapi.EventStdout}}
		x.stdin = &stdinPipe{f: master, keep: req.StdinOpen, tty: true}
		return x, nil
	}
	if req.Stdin || req.StdinOpen {
		r, w, err := os.Pipe()
		if err != nil {
			return x, fsError(err)
		}
		x.child[0] = r
		x.stdin = &stdinPipe{f: w, keep: req.StdinOpen}
	} else if x.child[0], err = os.Open(os.DevNull); err != nil {
		return x, fsError(err)
	}
	x.spare = append(x.spare, x.child[0])
	for i, typ := range []string{agentapi.EventStdout, agentapi.EventStderr} {
		r, w, err := os.Pipe()
		if err != nil {
			return x, fsError(err)
		}
		x.ours = append(x.ours, r)
		x.child[i+1] = w
		x.spare = append(x.spare, w)
		x.outputs = append(x.outputs, execOutput{r, typ})
	}
	return x, nil
}

// childFds are the child's fds 0, 1 and 2 for ForkExec.
func (x *execIO) childFds() []uintptr {
	return []uintptr{x.child[0].Fd(), x.child[1].Fd(), x.child[2].Fd()}
}

// started closes the child's ends: the child has its copies (or failed to
// start). Idempotent.
func (x *execIO) started() {
	for _, f := range x.spare {
		f.Close()
	}
	x.spare = nil
}

// closeOurs closes the agent's ends once the exec is over, and the stdin
// pipe of an exec that never started.
func (x *execIO) closeOurs() {
	x.started()
	if x.stdin != nil {
		x.stdin.release()
	}
	for _, f := range x.ours {
		f.Close()
	}
}

// setReadDeadline sets the read deadline of every output.
func (x *execIO) setReadDeadline(t time.Time) {
	for _, o := range x.outputs {
		o.f.SetReadDeadline(t)
	}
}

package sandbox

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/state"
)

// A dead sandbox recorded by an older daemon, whose console tail was not
// escaped, is listed with it escaped: the API never hands out a guest's
// terminal controls.
func TestRecordedDeadSandboxConsoleEscaped(t *testing.T) {
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	e.registerDead(state.SandboxRecord{ID: "sb-old", Tag: "base",
		DeadReason: "qemu exited\nconsole tail:\n\x1b[2Jpanic", ConsoleTail: "\x1b]0;pwned\x07panic\r\n"})
	s, err := e.Get("sb-old")
	if err != nil {
		t.Fatal(err)
	}
	info := s.Info()
	for _, v := range []string{info.DeadReason, info.ConsoleTail} {
		if strings.ContainsAny(v, "\x1b\x07\r") || !strings.Contains(v, `\x1b`) {
			t.Errorf("not escaped: %q", v)
		}
	}
}

package identity

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

func TestValidate(t *testing.T) {
	if err := Validate(agentapi.Identity{Entropy: make([]byte, 31)}); err == nil {
		t.Error("31 bytes of entropy accepted")
	}
	if err := Validate(agentapi.Identity{Entropy: make([]byte, 32), Hostname: string(bytes.Repeat([]byte("a"), 65))}); err == nil {
		t.Error("65-byte hostname accepted")
	}
	if err := Validate(agentapi.Identity{Entropy: make([]byte, 32), Hostname: "sb-1"}); err != nil {
		t.Error(err)
	}
}

func TestPythonSeed(t *testing.T) {
	a, b := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	if bytes.Equal(PythonSeed(a), PythonSeed(b)) || !bytes.Equal(PythonSeed(a), PythonSeed(a)) || bytes.Equal(PythonSeed(a), a) {
		t.Fatal("PythonSeed is not a deterministic, input-dependent hash")
	}
}

// AddEntropy needs CAP_SYS_ADMIN; run as root (the VM's agent is) it must
// succeed, otherwise it must fail with EPERM rather than pretend.
func TestAddEntropy(t *testing.T) {
	b := make([]byte, 32)
	rand.Read(b)
	err := AddEntropy(b)
	if os.Geteuid() == 0 {
		if err != nil {
			t.Fatalf("as root: %v", err)
		}
		return
	}
	if !errors.Is(err, unix.EPERM) {
		t.Fatalf("unprivileged AddEntropy = %v, want EPERM", err)
	}
}

func TestInfoHelpers(t *testing.T) {
	if KernelRelease() == "" || Hostname() == "" || Uptime() <= 0 {
		t.Fatalf("kernel %q hostname %q uptime %v", KernelRelease(), Hostname(), Uptime())
	}
}

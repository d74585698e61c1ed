package bench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/forkd-dev/forkd/internal/testutil"
)

// watchdogEnv makes this test binary the watchdog (`forkd bench watchdog`):
// its arguments are then RUN_DIR DATA_DIR OWNER.
const watchdogEnv = "FORKD_BENCH_TEST_WATCHDOG"

func TestMain(m *testing.M) {
	if os.Getenv(watchdogEnv) != "" && len(os.Args) == 4 {
		owner, _ := strconv.Atoi(os.Args[3])
		if err := Watchdog(os.Args[1], os.Args[2], owner); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeVMM is a process with the command line of a QEMU the driver started
// with run dir runDir.
func fakeVMM(runDir string) *exec.Cmd {
	return testutil.FakeVMM(60, "-name", "forkd-"+filepath.Base(runDir),
		"-qmp", "unix:"+filepath.Join(runDir, "qmp.sock")+",server=on,wait=off")
}

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

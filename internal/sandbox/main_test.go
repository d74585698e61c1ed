package sandbox

import (
	"os"
	"testing"

	"github.com/forkd-dev/forkd/internal/uffd/uffdtest"
)

func TestMain(m *testing.M) {
	uffdtest.RunChild() // a page server test's stand-in VMM: never returns
	os.Exit(m.Run())
}

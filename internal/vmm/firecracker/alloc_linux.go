package firecracker

import (
	"os"
	"syscall"
)

// allocated is how many bytes a file takes on disk.
func allocated(st os.FileInfo) int64 {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return s.Blocks * 512
	}
	return st.Size()
}

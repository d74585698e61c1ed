// Package logfollow copies a log file to a writer as it grows, like
// `tail -F`: it keeps following when the file is truncated (copytruncate
// rotation: reading restarts at the new end's beginning) or replaced
// (rename rotation: the old file is read to its end, then the new one from
// its start), and waits for a file that does not exist yet.
//
// Changes are found by polling the file's size and identity, so it works
// on any file system and needs no inotify instance.
package logfollow

import (
	"context"
	"errors"
	"io"
	"os"
	"syscall"
	"time"
)

// DefaultInterval is how often Follow looks for new data.
const DefaultInterval = 200 * time.Millisecond

// Options adjust Follow.
type Options struct {
	// From is the offset to start at in the file as it is when Follow
	// starts; negative counts back from its end (-4096: its last 4 KiB).
	From int64
	// Interval between looks (DefaultInterval when zero).
	Interval time.Duration
}

// Follow copies path to w from opts.From until ctx is done, which ends it
// with a nil error. It fails only when w fails or path cannot be read for a
// reason other than not existing.
func Follow(ctx context.Context, path string, w io.Writer, opts Options) error {
	interval := opts.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	first := true
	var off int64
	buf := make([]byte, 64<<10)
	for {
		if f == nil {
			nf, err := os.Open(path)
			switch {
			case err == nil:
				f = nf
				off = 0
				if first {
					off = startOffset(f, opts.From)
				}
				first = false
			case errors.Is(err, os.ErrNotExist):
				first = false // a file that appears later is read whole
			default:
				return err
			}
		}
		if f != nil {
			var err error
			if off, err = drain(f, off, w, buf); err != nil {
				return err
			}
			switch st := check(f, path, off); st {
			case truncated:
				off = 0
				continue
			case replaced:
				// The old file's last lines were written before the
				// rename: read them, then move to the new file.
				if _, err := drain(f, off, w, buf); err != nil {
					return err
				}
				f.Close()
				f = nil
				continue
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

func startOffset(f *os.File, from int64) int64 {
	st, err := f.Stat()
	if err != nil {
		return 0
	}
	switch {
	case from < 0:
		return max(st.Size()+from, 0)
	case from > st.Size():
		return st.Size()
	}
	return from
}

// drain copies f from off to its current end and returns the new offset.
func drain(f *os.File, off int64, w io.Writer, buf []byte) (int64, error) {
	for {
		n, err := f.ReadAt(buf, off)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return off, werr
			}
			off += int64(n)
		}
		if errors.Is(err, io.EOF) || n == 0 {
			return off, nil
		}
		if err != nil {
			return off, err
		}
	}
}

type change int

const (
	same change = iota
	truncated
	replaced
)

// check compares the open file with what path names now.
func check(f *os.File, path string, off int64) change {
	cur, err := f.Stat()
	if err != nil {
		return replaced
	}
	if cur.Size() < off {
		return truncated
	}
	now, err := os.Stat(path)
	if err != nil {
		// Renamed away and not recreated yet: keep the old one.
		return same
	}
	a, b := cur.Sys().(*syscall.Stat_t), now.Sys().(*syscall.Stat_t)
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return replaced
	}
	return same
}

package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Tail returns the last n records of the log in dir, oldest first. It reads
// backwards from the end of audit.log and on into the rotated files, and
// skips an incomplete final line (a write in progress, or a crash that Open
// and Verify report). It does not check the chain.
func Tail(dir string, n int) ([]Record, error) {
	if n <= 0 {
		return nil, nil
	}
	files, err := listFiles(dir)
	if err != nil {
		return nil, err
	}
	var lines [][]byte // newest first
	for i := len(files) - 1; i >= 0 && len(lines) < n; i-- {
		if files[i].notFound {
			continue
		}
		got, err := lastLines(filepath.Join(dir, files[i].name), n-len(lines))
		if err != nil {
			return nil, err
		}
		lines = append(lines, got...)
	}
	recs := make([]Record, 0, len(lines))
	for _, l := range slices.Backward(lines) {
		var r Record
		if err := json.Unmarshal(l, &r); err != nil {
			return nil, fmt.Errorf("audit tail %s: a line near the end is not a record (%v); run `forkd audit verify --dir %s`: %w", dir, err, dir, errdefs.ErrFailedPrecondition)
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// lastLines returns up to n complete lines from the end of a file, newest
// first, without their newlines; bytes after the last newline are skipped.
func lastLines(path string, n int) ([][]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // rotated away meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("audit tail: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("audit tail: %w", err)
	}
	const chunk = 64 << 10
	var lines [][]byte
	var rest []byte // bytes before the newest newline seen, not yet split
	pos, sawNewline := st.Size(), false
	for pos > 0 && len(lines) < n {
		k := min(int64(chunk), pos)
		pos -= k
		buf := make([]byte, k, int(k)+len(rest))
		if _, err := f.ReadAt(buf, pos); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("audit tail: %w", err)
		}
		rest = append(buf, rest...)
		for len(lines) < n {
			i := bytes.LastIndexByte(rest, '\n')
			if i < 0 {
				break
			}
			if sawNewline {
				lines = append(lines, bytes.Clone(rest[i+1:]))
			}
			sawNewline = true
			rest = rest[:i]
		}
		if len(rest) > 2*MaxLineBytes+chunk {
			return nil, fmt.Errorf("audit tail %s: a line is longer than %d bytes; run `forkd audit verify`: %w", path, MaxLineBytes, errdefs.ErrFailedPrecondition)
		}
	}
	if pos == 0 && sawNewline && len(lines) < n {
		lines = append(lines, bytes.Clone(rest)) // the file's first line
	}
	return lines, nil
}

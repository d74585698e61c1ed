package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// File names in a log directory.
const (
	currentName = "audit.log"
	lockName    = "audit.lock"
	tornPrefix  = currentName + ".torn-"
)

// rotatedName is the name audit.log gets when it is rotated; firstSeq is the
// seq of its first record.
func rotatedName(firstSeq uint64) string { return fmt.Sprintf("audit-%020d.log", firstSeq) }

// parseRotatedName returns the first seq a rotated file's name claims.
func parseRotatedName(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, "audit-")
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, ".log"); !ok || s == "" {
		return 0, false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// logFile is one file of a log, in chain order.
type logFile struct {
	name     string // base name
	nameSeq  uint64 // first seq the name claims; 0 for audit.log
	rotated  bool
	notFound bool // audit.log that does not exist (yet)
}

// listFiles returns the rotated files of dir in chain order, then audit.log
// (marked notFound when it does not exist). A missing dir is ErrNotFound.
func listFiles(dir string) ([]logFile, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("audit log directory %s: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("audit log directory: %w", err)
	}
	var files []logFile
	current := logFile{name: currentName, notFound: true}
	for _, e := range ents {
		if e.Name() == currentName {
			current.notFound = false
			continue
		}
		if n, ok := parseRotatedName(e.Name()); ok && e.Type().IsRegular() {
			files = append(files, logFile{name: e.Name(), nameSeq: n, rotated: true})
		}
	}
	sort.SliceStable(files, func(i, j int) bool {
		if files[i].nameSeq != files[j].nameSeq {
			return files[i].nameSeq < files[j].nameSeq
		}
		return files[i].name < files[j].name
	})
	return append(files, current), nil
}

// rawLine is one line of a log file as read, with its chain hash.
type rawLine struct {
	no   int    // 1-based line number
	data []byte // without '\n'; valid until the next read; nil when long
	hash string // hashLine of the full line
	torn bool   // the file ended before the line's '\n'
	long bool   // longer than MaxLineBytes
}

// lineReader reads lines of any length, hashing each and keeping at most
// MaxLineBytes of it.
type lineReader struct {
	r   *bufio.Reader
	buf []byte
	no  int
}

func newLineReader(r io.Reader) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// next returns the next line, or io.EOF after the last.
func (lr *lineReader) next() (rawLine, error) {
	h := sha256.New()
	lr.buf = lr.buf[:0]
	l := rawLine{no: lr.no + 1}
	read := false
	for {
		frag, err := lr.r.ReadSlice('\n')
		read = read || len(frag) > 0
		data := frag
		if err == nil {
			data = frag[:len(frag)-1]
		}
		h.Write(data)
		if !l.long && len(lr.buf)+len(data) <= MaxLineBytes {
			lr.buf = append(lr.buf, data...)
		} else {
			l.long = true
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			if !read {
				return rawLine{}, io.EOF
			}
			l.torn = true
			break
		}
		return rawLine{}, err
	}
	lr.no++
	if !l.long {
		l.data = lr.buf
	}
	l.hash = hex.EncodeToString(h.Sum(nil))
	return l, nil
}

// countLines returns the number of newlines in a file, for error messages.
func countLines(path string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	buf := make([]byte, 256<<10)
	for {
		k, err := f.Read(buf)
		n += bytes.Count(buf[:k], []byte{'\n'})
		if err != nil {
			return n
		}
	}
}

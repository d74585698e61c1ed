package sandbox

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestStepOutputLines: a step's output reaches the progress a line at a
// time, split writes joined, terminal controls neutralised, long lines
// cut and lines past the bound counted.
func TestStepOutputLines(t *testing.T) {
	var got []string
	l := newLineWriter(func(s string) { got = append(got, s) }, 4)
	l.Write([]byte("Collecting pan"))
	l.Write([]byte("das\nDownloading \x1b[2Jx\r\n"))
	l.Write([]byte(strings.Repeat("y", maxStepLineBytes+100) + "\n\xff\xfe bad\n"))
	l.Write([]byte("dropped 1\ndropped 2\nlast, no newline"))
	l.Flush()
	want := []string{
		"  | Collecting pandas",
		"  | Downloading  [2Jx",
		"  | " + strings.Repeat("y", maxStepLineBytes) + " …",
		"  | \uFFFD bad",
		"  | … 3 more lines not shown",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("progress lines:\n%q\nwant:\n%q", got, want)
	}
}

// TestStepOutputConcurrentWriters: stdout and stderr write at once (run
// with -race); every line arrives whole.
func TestStepOutputConcurrentWriters(t *testing.T) {
	var mu sync.Mutex
	n := 0
	l := newLineWriter(func(s string) {
		mu.Lock()
		defer mu.Unlock()
		if s != "  | line" {
			t.Errorf("line %q", s)
		}
		n++
	}, 1000)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				l.Write([]byte("line\n"))
			}
		}()
	}
	wg.Wait()
	l.Flush()
	if n != 200 {
		t.Fatalf("%d lines, want 200", n)
	}
}

// TestStepOutputNil: no progress, nothing kept.
func TestStepOutputNil(t *testing.T) {
	l := newLineWriter(nil, 10)
	if n, err := l.Write([]byte("x\n")); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	l.Flush()
}

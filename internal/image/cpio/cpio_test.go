package cpio

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRoundTripWithSystemCpio writes every entry type and reads the archive
// back with GNU cpio, the reference implementation of newc.
func TestRoundTripWithSystemCpio(t *testing.T) {
	cpioBin, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio not installed (apt-get install cpio)")
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	big := bytes.Repeat([]byte("0123456789abcdef"), 10000) // not a multiple of 4 after the tail
	big = append(big, 'x', 'y', 'z')
	steps := []error{
		w.Dir("dev", 0o755),
		w.CharDev("dev/console", 0o600, 5, 1),
		w.CharDev("dev/null", 0o666, 1, 3),
		w.Dir("tmp", 0o1777),
		w.Dir("lib", 0o755),
		w.Dir("lib/modules", 0o755),
		w.File("init", 0o755, []byte("#!/bin/sh\necho hi\n")),
		w.File("lib/modules/a.ko", 0o644, big),
		w.File("empty", 0o644, nil),
		w.FileFrom("lib/modules/b.ko", 0o644, 5, strings.NewReader("12345")),
		w.Symlink("sh", "/bin/busybox"),
		w.Close(),
	}
	for i, err := range steps {
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	if buf.Len()%512 != 0 {
		t.Errorf("archive length %d is not a multiple of 512", buf.Len())
	}
	archive := filepath.Join(t.TempDir(), "a.cpio")
	if err := os.WriteFile(archive, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	list := exec.Command(cpioBin, "-itv", "--quiet", "-F", archive)
	out, err := list.CombinedOutput()
	if err != nil {
		t.Fatalf("cpio -itv: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []struct{ prefix, suffix string }{
		{"drwxr-xr-x", " dev"},
		{"crw-------", " dev/console"},
		{"crw-rw-rw-", " dev/null"},
		{"drwxrwxrwt", " tmp"},
		{"drwxr-xr-x", " lib"},
		{"drwxr-xr-x", " lib/modules"},
		{"-rwxr-xr-x", " init"},
		{"-rw-r--r--", " lib/modules/a.ko"},
		{"-rw-r--r--", " empty"},
		{"-rw-r--r--", " lib/modules/b.ko"},
		{"lrwxrwxrwx", " sh -> /bin/busybox"},
	}
	if len(lines) != len(want) {
		t.Fatalf("cpio lists %d entries, want %d:\n%s", len(lines), len(want), out)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w.prefix) || !strings.HasSuffix(lines[i], w.suffix) {
			t.Errorf("entry %d = %q, want %s ...%s", i, lines[i], w.prefix, w.suffix)
		}
		if !strings.Contains(lines[i], " root ") {
			t.Errorf("entry %d = %q, want owner root", i, lines[i])
		}
	}
	if f := strings.Fields(lines[1]); len(f) < 6 || f[4] != "5," || f[5] != "1" {
		t.Errorf("console device = %q, want 5, 1", lines[1])
	}

	for name, data := range map[string][]byte{"lib/modules/a.ko": big, "init": []byte("#!/bin/sh\necho hi\n"), "lib/modules/b.ko": []byte("12345")} {
		cmd := exec.Command(cpioBin, "-i", "--quiet", "--to-stdout", "-F", archive, name)
		got, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio extract %s: %v", name, err)
		}
		if !bytes.Equal(got, data) {
			t.Errorf("%s: extracted %d bytes, differ from the %d written", name, len(got), len(data))
		}
	}
}

func TestDeterministic(t *testing.T) {
	build := func() []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		w.Dir("etc", 0o755)
		w.File("etc/x", 0o644, []byte("abc"))
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	if !bytes.Equal(build(), build()) {
		t.Error("same entries produced different archives")
	}
}

func TestRejectsMistakes(t *testing.T) {
	cases := map[string]func(w *Writer) error{
		"missing parent": func(w *Writer) error { return w.File("a/b", 0o644, nil) },
		"duplicate": func(w *Writer) error {
			w.Dir("a", 0o755)
			return w.Dir("a", 0o755)
		},
		"short data": func(w *Writer) error {
			w.WriteHeader(Header{Name: "f", Mode: TypeRegular | 0o644, Size: 10})
			w.Write([]byte("abc"))
			return w.Close()
		},
		"too much data": func(w *Writer) error {
			w.WriteHeader(Header{Name: "f", Mode: TypeRegular | 0o644, Size: 1})
			_, err := w.Write([]byte("abc"))
			return err
		},
		"trailer name": func(w *Writer) error { return w.Dir("TRAILER!!!", 0o755) },
		"empty name":   func(w *Writer) error { return w.Dir("/", 0o755) },
		"data on dir":  func(w *Writer) error { return w.WriteHeader(Header{Name: "d", Mode: TypeDir, Size: 3}) },
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			if err := f(NewWriter(&bytes.Buffer{})); err == nil {
				t.Error("no error")
			}
		})
	}
}

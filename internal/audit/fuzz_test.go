package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzVerify feeds arbitrary bytes as a log (split into a rotated file and
// audit.log) to Verify, Tail and Open. None may panic, and a log that Verify
// calls intact must open and stay intact after one more record.
func FuzzVerify(f *testing.F) {
	seed := seedLog(f)
	f.Add(seed, uint16(0))
	f.Add(seed, uint16(len(seed)/2))
	f.Add(seed[:len(seed)-7], uint16(0))
	f.Add([]byte("{}\n\n{\"seq\":1}\n"), uint16(3))
	f.Add([]byte{}, uint16(0))
	liveRetryDelay = 0
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		dir := t.TempDir()
		cur := data
		if s := int(split); s > 0 && s <= len(data) {
			if err := os.WriteFile(filepath.Join(dir, rotatedName(1)), data[:s], 0o600); err != nil {
				t.Fatal(err)
			}
			cur = data[s:]
		}
		if err := os.WriteFile(filepath.Join(dir, currentName), cur, 0o600); err != nil {
			t.Fatal(err)
		}
		rep, err := Verify(dir)
		if err != nil {
			t.Fatalf("Verify: %v", err)
		}
		if !rep.OK && (rep.Problem == nil || rep.Problem.Message == "") {
			t.Fatalf("not OK without a problem: %+v", rep)
		}
		Tail(dir, 3)
		l, err := Open(dir, Options{})
		if !rep.OK {
			if err == nil {
				l.Close()
			}
			return
		}
		if err != nil {
			t.Fatalf("Verify OK but Open failed: %v", err)
		}
		if _, err := l.Append(rec(0)); err != nil {
			t.Fatal(err)
		}
		l.Close()
		if rep2, err := Verify(dir); err != nil || !rep2.OK || rep2.Records != rep.Records+1 {
			t.Fatalf("after one more record: %+v, %v", rep2, err)
		}
	})
}

// seedLog returns the bytes of a valid five-record log.
func seedLog(f *testing.F) []byte {
	dir := f.TempDir()
	l, err := Open(dir, Options{})
	if err != nil {
		f.Fatal(err)
	}
	for i := range 5 {
		if _, err := l.Append(rec(i)); err != nil {
			f.Fatal(err)
		}
	}
	l.Close()
	b, err := os.ReadFile(filepath.Join(dir, currentName))
	if err != nil {
		f.Fatal(err)
	}
	return bytes.Clone(b)
}

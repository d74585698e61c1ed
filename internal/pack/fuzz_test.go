package pack

import (
	"bytes"
	"context"
	"testing"
)

// FuzzUnpack feeds Unpack arbitrary bytes: it must not panic, and when it
// fails it must leave nothing behind.
func FuzzUnpack(f *testing.F) {
	src, _ := makeDataDir(f, "base", mib)
	var valid bytes.Buffer
	if _, err := Pack(context.Background(), src, "base", &valid, PackOptions{Concurrency: 1}); err != nil {
		f.Fatal(err)
	}
	f.Add(valid.Bytes())
	f.Add(valid.Bytes()[:valid.Len()/3])
	f.Add(valid.Bytes()[headerSize:]) // without the skippable header frame
	f.Add([]byte{})
	f.Add([]byte("\x28\xb5\x2f\xfd garbage"))
	chain := packChainSeed(f)
	f.Add(chain)
	f.Add(chain[:len(chain)/2])
	f.Fuzz(func(t *testing.T, data []byte) {
		dst := t.TempDir()
		_, _, err := Unpack(context.Background(), dst, bytes.NewReader(data), UnpackOptions{MaxLogicalBytes: 64 * mib})
		if err != nil {
			assertClean(t, dst, nil, nil)
		}
	})
}

// FuzzParseManifest checks the manifest parser on its own, where the
// fuzzer is not stopped by zstd checksums.
func FuzzParseManifest(f *testing.F) {
	src, _ := makeDataDir(f, "base", mib)
	var valid bytes.Buffer
	if _, err := Pack(context.Background(), src, "base", &valid, PackOptions{Concurrency: 1}); err != nil {
		f.Fatal(err)
	}
	f.Add(decode(f, valid.Bytes())[0].data)
	f.Add([]byte(`{"format_version":1,"snapshots":[{"id":"a","manifest":{}}]}`))
	f.Add(decode(f, packChainSeed(f))[0].data)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := parseManifest(data)
		if err != nil {
			return
		}
		for _, file := range m.Files {
			if file.Stored() < 0 || file.Stored() > file.Size {
				t.Fatalf("%s: accepted %d stored bytes of %d", file.Path, file.Stored(), file.Size)
			}
		}
	})
}

// packChainSeed is an archive of a chain of two layers on a 1 MiB base.
func packChainSeed(f *testing.F) []byte {
	src, _ := makeChain(f, mib)
	var buf bytes.Buffer
	if _, err := Pack(context.Background(), src, "l2", &buf, PackOptions{Concurrency: 1}); err != nil {
		f.Fatal(err)
	}
	return buf.Bytes()
}

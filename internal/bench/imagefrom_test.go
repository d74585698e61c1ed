package bench

import (
	"archive/tar"
	"io"
	"testing"
)

// TestRandomImageIsWhatWasAsked: the bench's image has the layers, files
// and bytes asked for, for linux, and two runs make different images
// (nothing of a new run is cached).
func TestRandomImageIsWhatWasAsked(t *testing.T) {
	o := ImageFromOptions{SizeMB: 1, Layers: 2, Files: 4}
	img, err := randomImage(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != o.Layers {
		t.Fatalf("%d layers (%v), want %d", len(layers), err, o.Layers)
	}
	var files int
	var bytes int64
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				files++
				bytes += h.Size
			}
		}
		rc.Close()
	}
	if files != o.Layers*o.Files || bytes != 1<<20 {
		t.Errorf("%d files of %d bytes in all, want %d files of 1 MiB", files, bytes, o.Layers*o.Files)
	}
	cf, err := img.ConfigFile()
	if err != nil || cf.OS != "linux" {
		t.Errorf("config %+v (%v), want linux", cf, err)
	}
	other, err := randomImage(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := img.Digest()
	d2, _ := other.Digest()
	if d1 == d2 {
		t.Errorf("two runs made the same image %s", d1)
	}
}

package ociimage

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func cachedDigests(t *testing.T, c Cache) []string {
	t.Helper()
	ls, err := c.List()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		if l.Bytes <= 0 {
			t.Errorf("cached layer %s takes %d bytes", l.Digest, l.Bytes)
		}
		out = append(out, l.Digest)
	}
	return out
}

// TestCacheListsAndRemovesLayers: two images sharing a layer leave three
// blobs; removing one leaves the others, a pull fetches it again, and
// digests that are not sha256 (or would name another path) are refused.
func TestCacheListsAndRemovesLayers(t *testing.T) {
	reg := newRegistry(t)
	l1 := layerOf(t, file("one", strings.Repeat("1", 5000)))
	l2 := layerOf(t, file("two", strings.Repeat("2", 5000)))
	l3 := layerOf(t, file("three", strings.Repeat("3", 5000)))
	refA := reg.push(t, "cache/a:v1", imageOf(t, v1.Config{}, l1, l2))
	refB := reg.push(t, "cache/b:v1", imageOf(t, v1.Config{}, l2, l3))
	p := testPuller(t)
	c := Cache{Dir: p.CacheDir}
	if got := cachedDigests(t, c); len(got) != 0 {
		t.Fatalf("empty cache lists %v", got)
	}
	for _, ref := range []string{refA, refB} {
		if _, _, err := pull(t, p, ref); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{hexOf(t, l1), hexOf(t, l2), hexOf(t, l3)}
	slices.Sort(want)
	if got := cachedDigests(t, c); !slices.Equal(got, want) {
		t.Fatalf("cache lists %v, want %v", got, want)
	}

	gone := hexOf(t, l1)
	absent := "sha256:" + strings.Repeat("0", 64)
	removed, err := c.Remove([]string{gone, absent})
	if err != nil || len(removed) != 1 || removed[0].Digest != gone || removed[0].Bytes <= 0 {
		t.Fatalf("Remove = %+v, %v; want just %s", removed, err, gone)
	}
	if got := cachedDigests(t, c); slices.Contains(got, gone) || len(got) != 2 {
		t.Fatalf("after Remove the cache lists %v", got)
	}
	for _, bad := range []string{"sha256:../../etc", "sha512:" + strings.Repeat("a", 128), "sha256:" + strings.Repeat("A", 64)} {
		if _, err := c.Remove([]string{bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Remove(%q) = %v, want invalid argument", bad, err)
		}
	}
	if _, _, err := pull(t, p, refA); err != nil {
		t.Fatalf("pull after the removal: %v", err)
	}
	if got := cachedDigests(t, c); !slices.Equal(got, want) {
		t.Fatalf("after a new pull the cache lists %v, want %v", got, want)
	}
}

// TestCacheRemoveWaitsOutPulls: while a pull is downloading, Remove
// removes nothing and says why; once the pull is done it removes.
func TestCacheRemoveWaitsOutPulls(t *testing.T) {
	reg := newRegistry(t)
	held := layerOf(t, file("held", strings.Repeat("h", 5000)))
	slow := layerOf(t, file("slow", strings.Repeat("s", 5000)))
	refHeld := reg.push(t, "cache/held:v1", imageOf(t, v1.Config{}, held))
	refSlow := reg.push(t, "cache/slow:v1", imageOf(t, v1.Config{}, held, slow))
	p := testPuller(t)
	c := Cache{Dir: p.CacheDir}
	if _, _, err := pull(t, p, refHeld); err != nil {
		t.Fatal(err)
	}

	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	reg.mu.Lock()
	reg.tamper[hexOf(t, slow)] = func(w http.ResponseWriter, body []byte) {
		once.Do(func() { close(entered) })
		<-release
		w.Write(body)
	}
	reg.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		img, err := p.Resolve(ctx, refSlow)
		if err == nil {
			_, err = img.Unpack(ctx, t.TempDir())
		}
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the pull ended before its download began: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the pull never asked for its second layer")
	}
	removed, err := c.Remove([]string{hexOf(t, held)})
	if !errdefs.IsFailedPrecondition(err) || len(removed) != 0 || !strings.Contains(err.Error(), "retry") {
		t.Errorf("Remove during a pull = %+v, %v; want failed precondition and nothing removed", removed, err)
	}
	if _, err := os.Stat(mustPath(t, c, hexOf(t, held))); err != nil {
		t.Errorf("the layer the pull uses is gone: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the pull: %v", err)
	}
	if removed, err := c.Remove([]string{hexOf(t, held)}); err != nil || len(removed) != 1 {
		t.Fatalf("Remove after the pull = %+v, %v", removed, err)
	}
}

func mustPath(t *testing.T, c Cache, d string) string {
	t.Helper()
	p, err := c.path(d)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

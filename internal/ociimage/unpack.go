package ociimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Fetch downloads the layers that are not cached yet.
func (img *Image) Fetch(ctx context.Context) error {
	unlock, err := lockCacheShared(ctx, img.p.CacheDir)
	if err != nil {
		return err
	}
	defer unlock()
	return img.fetch(ctx)
}

func (img *Image) fetch(ctx context.Context) error {
	c := blobCache{img.p.CacheDir}
	for i, l := range img.layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.has(l.desc.Digest, l.desc.Size) {
			continue
		}
		start := time.Now()
		rc, err := l.l.Compressed()
		if err != nil {
			class := errdefs.ErrUnavailable
			// go-containerregistry compares Content-Length with the
			// manifest's size before reading; it has no error type for it.
			if strings.Contains(err.Error(), "does not match expected size") {
				class = errdefs.ErrInvalidArgument
				err = fmt.Errorf("%v (truncated or corrupt blob)", err)
			}
			return fmt.Errorf("image %s: layer %d/%d %s: %v: %w", img.Ref, i+1, len(img.layers), l.desc.Digest, err, class)
		}
		err = c.put(rc, l.desc.Digest, l.desc.Size)
		rc.Close()
		if err != nil {
			return fmt.Errorf("image %s: layer %d/%d: %w", img.Ref, i+1, len(img.layers), err)
		}
		img.say("pull: layer %d/%d %s, %d MB in %s", i+1, len(img.layers), l.desc.Digest.Hex[:12],
			l.desc.Size>>20, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// Unpack fetches the layers that are not cached and applies them in order
// to dir, an empty directory that the caller owns (a staging directory: on
// error it holds a partial tree to throw away). The cache is held (shared)
// throughout, so Cache.Remove cannot take a layer from under it.
func (img *Image) Unpack(ctx context.Context, dir string) (Stats, error) {
	var st Stats
	unlock, err := lockCacheShared(ctx, img.p.CacheDir)
	if err != nil {
		return st, err
	}
	defer unlock()
	if err := img.fetch(ctx); err != nil {
		return st, err
	}
	a := &applier{t: tree{dir: dir}, lim: img.p.Limits.withDefaults(), stats: &st, owners: os.Geteuid() == 0}
	c := blobCache{img.p.CacheDir}
	for i, l := range img.layers {
		if err := img.applyLayer(ctx, a, c.path(l.desc.Digest), l); err != nil {
			return st, fmt.Errorf("image %s: layer %d/%d %s: %w", img.Ref, i+1, len(img.layers), l.desc.Digest, err)
		}
	}
	img.say("pull: %s unpacked, %d layers, %d entries, %d MB", img.Ref, len(img.layers), st.Entries, st.Bytes>>20)
	return st, nil
}

// applyLayer applies one cached blob, checking its uncompressed content
// against the config's diff ID.
func (img *Image) applyLayer(ctx context.Context, a *applier, blob string, l layer) error {
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	r, closeFn, err := decompress(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return err
	}
	defer closeFn()
	h := sha256.New()
	tee := io.TeeReader(r, h)
	if err := a.apply(ctx, tee); err != nil {
		return err
	}
	// The tar's end-of-archive blocks and padding count for the diff ID;
	// the trailer is bounded like everything else.
	if n, err := io.Copy(io.Discard, io.LimitReader(tee, a.lim.MaxBytes)); err != nil {
		return fmt.Errorf("layer is corrupt after the end of its archive (%v): %w", err, errdefs.ErrInvalidArgument)
	} else if n == a.lim.MaxBytes {
		return fmt.Errorf("layer has more than %d bytes of trailing data (Limits.MaxBytes): %w", a.lim.MaxBytes, errdefs.ErrResourceExhausted)
	}
	if l.diffID.Algorithm == "sha256" {
		if got := hex.EncodeToString(h.Sum(nil)); got != l.diffID.Hex {
			return fmt.Errorf("uncompressed content has sha256:%s, the image config says %s (corrupt image): %w",
				got, l.diffID, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// decompress picks the layer's compression from its first bytes: gzip,
// zstd, or none (a plain tar).
func decompress(br *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("layer is not valid gzip (%v): %w", err, errdefs.ErrInvalidArgument)
		}
		return zr, func() { zr.Close() }, nil
	case bytes.Equal(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, fmt.Errorf("layer is not valid zstd (%v): %w", err, errdefs.ErrInvalidArgument)
		}
		return zr, zr.Close, nil
	}
	return br, func() {}, nil
}

func (img *Image) say(format string, a ...any) {
	if img.p.Progress != nil {
		img.p.Progress(fmt.Sprintf(format, a...))
	}
}

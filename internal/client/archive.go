package client

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// archiveType is the media type of snapshot archives (a zstd stream).
const archiveType = "application/zstd"

// ExportOptions tunes ExportArchive.
type ExportOptions struct {
	// ExcludeImages leaves the image's bytes out of the archive; unpacking
	// it then needs the image on the receiving host.
	ExcludeImages bool
}

// ExportArchive streams the archive of a snapshot into w and returns its
// size. A stream the daemon cuts short is an error.
func (c *Client) ExportArchive(ctx context.Context, tag string, w io.Writer, opts ExportOptions) (int64, error) {
	q := url.Values{}
	if opts.ExcludeImages {
		q.Set("image", "0")
	}
	resp, err := c.send(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(tag)+"/archive", q, nil, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("archive of %q cut after %d bytes: %w", tag, n, err)
	}
	return n, nil
}

// ImportOptions tunes ImportArchive.
type ImportOptions struct {
	// Tag, if set, is the tag to create instead of the archive's.
	Tag string
	// Force replaces an existing snapshot with the same tag.
	Force bool
	// VerifyKey, if set, makes the daemon refuse an archive not signed by
	// this key.
	VerifyKey ed25519.PublicKey
}

// ImportArchive sends an archive to the daemon, which verifies it and adds
// its snapshot.
func (c *Client) ImportArchive(ctx context.Context, r io.Reader, opts ImportOptions) (apiv1.Snapshot, error) {
	q := url.Values{}
	if opts.Tag != "" {
		q.Set("tag", opts.Tag)
	}
	if opts.Force {
		q.Set("force", "1")
	}
	if opts.VerifyKey != nil {
		if len(opts.VerifyKey) != ed25519.PublicKeySize {
			return apiv1.Snapshot{}, fmt.Errorf("verify key has %d bytes, want %d: %w", len(opts.VerifyKey), ed25519.PublicKeySize, errdefs.ErrInvalidArgument)
		}
		q.Set("verify_key", base64.RawURLEncoding.EncodeToString(opts.VerifyKey))
	}
	resp, err := c.send(ctx, http.MethodPost, "/v1/snapshots/import", q, r, http.Header{"Content-Type": {archiveType}})
	if err != nil {
		return apiv1.Snapshot{}, err
	}
	defer resp.Body.Close()
	var out apiv1.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("decode import response: %w", err)
	}
	return out, nil
}

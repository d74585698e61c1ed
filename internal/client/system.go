package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// RemoveImage removes an image by digest, unique digest prefix or recipe
// name (its newest image); one a snapshot was taken from is refused
// (errdefs.IsFailedPrecondition, naming the snapshots).
func (c *Client) RemoveImage(ctx context.Context, ref string) (apiv1.Image, error) {
	var out apiv1.Image
	return out, c.call(ctx, http.MethodDelete, "/v1/images/"+url.PathEscape(ref), nil, nil, &out)
}

// DiskUsage reports what the daemon's images, snapshots, memory images,
// pools and sandboxes take.
func (c *Client) DiskUsage(ctx context.Context) (apiv1.DiskUsage, error) {
	var out apiv1.DiskUsage
	return out, c.call(ctx, http.MethodGet, "/v1/system/df", nil, nil, &out)
}

// Prune forgets dead sandboxes and removes what no snapshot needs
// (images too with req.Images); with req.DryRun it only says what.
func (c *Client) Prune(ctx context.Context, req apiv1.PruneRequest) (apiv1.PruneResponse, error) {
	var out apiv1.PruneResponse
	return out, c.call(ctx, http.MethodPost, "/v1/system/prune", nil, req, &out)
}

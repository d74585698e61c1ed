package api

import (
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// deleteImage removes an image no snapshot uses: {digest} is a digest, a
// unique digest prefix or a recipe name (its newest image). One a
// snapshot was taken from is 409 naming the snapshots.
func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) {
	img, err := s.Engine.RemoveImage(r.Context(), r.PathValue("digest"))
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	noteTargets(r, img.Digest)
	writeJSON(w, imageInfo(img))
}

// diskUsage answers GET /v1/system/df.
func (s *Server) diskUsage(w http.ResponseWriter, r *http.Request) {
	du, err := s.Engine.DiskUsage()
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, apiv1.DiskUsage{
		Images: usageInfo(du.Images), Snapshots: usageInfo(du.Snapshots), Layers: usageInfo(du.Layers),
		MemoryImages: usageInfo(du.MemoryImages), OCILayers: usageInfo(du.OCILayers),
		Pools: usageInfo(du.Pools), Sandboxes: usageInfo(du.Sandboxes),
	})
}

func usageInfo(u sandbox.Usage) apiv1.Usage {
	return apiv1.Usage{Count: u.Count, Active: u.Active, SizeBytes: u.Bytes, ReclaimableBytes: u.Reclaim}
}

// prune answers POST /v1/system/prune: dead sandboxes forgotten, orphaned
// memory images and unlisted OCI layers removed, and with images the
// unused images. What was
// removed before a failure is in the audit record.
func (s *Server) prune(w http.ResponseWriter, r *http.Request) {
	var req apiv1.PruneRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	res, err := s.Engine.Prune(r.Context(), sandbox.PruneOptions{Images: req.Images, DryRun: req.DryRun})
	out := apiv1.PruneResponse{
		DryRun: req.DryRun, Sandboxes: append([]string{}, res.Sandboxes...), Images: []apiv1.Image{},
		MemoryImages: append([]string{}, res.MemoryImages...), OCILayers: append([]string{}, res.OCILayers...),
		ReclaimedBytes: res.Bytes, Skipped: res.Skipped,
	}
	for _, img := range res.Images {
		out.Images = append(out.Images, imageInfo(img))
		if !req.DryRun {
			noteTargets(r, img.Digest)
		}
	}
	if !req.DryRun {
		noteTargets(r, res.Sandboxes...)
	}
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	writeJSON(w, out)
}

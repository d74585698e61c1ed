package api

import (
	"context"
	"fmt"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// buildRecipe is the recipe a build request names: a known one, a recipe
// file's contents, or an OCI image reference (from).
func (s *Server) buildRecipe(req apiv1.BuildImageRequest) (*recipe.Recipe, error) {
	if req.From == "" {
		if req.InsecureRegistry {
			return nil, fmt.Errorf("insecure_registry is set without from; in a recipe, set insecure_registry next to from: %w", errdefs.ErrInvalidArgument)
		}
		return s.Engine.ResolveRecipe(req.Recipe, req.RecipeTOML)
	}
	if req.Recipe != "" || req.RecipeTOML != "" {
		return nil, fmt.Errorf("give from, a recipe name or recipe_toml, not several (a recipe can say from = \"REF\" itself): %w", errdefs.ErrInvalidArgument)
	}
	return recipe.FromRef(req.From, req.InsecureRegistry)
}

// buildImage starts a build as an operation and answers 202 with it; the
// build runs on the daemon's context, not the request's. An
// Idempotency-Key makes a retry answer the same operation.
func (s *Server) buildImage(w http.ResponseWriter, r *http.Request) {
	var req apiv1.BuildImageRequest
	if err := decode(w, r, &req); err != nil {
		writeProblem(w, r, err)
		return
	}
	answer := func(opID string) {
		op, _ := s.ops.get(opID)
		writeAccepted(w, op)
	}
	claim, ok := s.claimIdempotency(w, r, req, answer)
	if !ok {
		return
	}
	defer claim.release()
	rcp, err := s.buildRecipe(req)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	// The slot is taken before the 202, so a daemon already building
	// --max-builds images, or a tenant at its bound of builds, answers
	// 429 (with Retry-After) instead of an operation that fails at once;
	// the build releases it.
	tenant, quota := s.buildOwner(r)
	slot, err := s.Engine.TryAcquireBuild("build image "+rcp.Name, tenant, quota)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	op, err := s.startOperation(r, apiv1.OpImageBuild, rcp.Name, func(ctx context.Context, pr opProgress) (any, error) {
		img, err := s.Engine.BuildImageWith(ctx, slot, rcp, pr.Message)
		if err != nil {
			return nil, err
		}
		return imageInfo(img), nil
	})
	if err != nil {
		slot.Release()
		writeProblem(w, r, err)
		return
	}
	claim.operation(op.ID)
	answer(op.ID)
}

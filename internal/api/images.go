package api

import (
	"context"
	"fmt"
	"io/fs"
	"net/http"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/dockerfile"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// buildRecipe is the recipe a build request names: a known one, a recipe
// file's contents, or an OCI image reference (from).
func (s *Server) buildRecipe(req apiv1.BuildSource) (*recipe.Recipe, error) {
	bctx, err := buildContext(req.Context)
	if err != nil {
		return nil, err
	}
	if req.Dockerfile != "" {
		if req.From != "" || req.Recipe != "" || req.RecipeTOML != "" {
			return nil, fmt.Errorf("give a dockerfile, from, a recipe name or recipe_toml, not several: %w", errdefs.ErrInvalidArgument)
		}
		f, err := dockerfile.Parse("Dockerfile", []byte(req.Dockerfile), req.BuildArgs)
		if err != nil {
			return nil, err
		}
		return f.Recipe(req.Name, []byte(req.Dockerfile), req.InsecureRegistry, bctx)
	}
	if req.Name != "" || len(req.BuildArgs) > 0 {
		return nil, fmt.Errorf("name and build_args go with dockerfile: %w", errdefs.ErrInvalidArgument)
	}
	if req.From == "" {
		if req.RecipeTOML != "" || len(bctx) > 0 {
			r, err := s.Engine.ResolveRecipe(req.Recipe, req.RecipeTOML)
			if err != nil {
				return nil, err
			}
			r.Context = bctx
			return r, nil
		}
		if req.InsecureRegistry {
			return nil, fmt.Errorf("insecure_registry is set without from; in a recipe, set insecure_registry next to from: %w", errdefs.ErrInvalidArgument)
		}
		return s.Engine.ResolveRecipe(req.Recipe, req.RecipeTOML)
	}
	if req.Recipe != "" || req.RecipeTOML != "" {
		return nil, fmt.Errorf("give from, a recipe name or recipe_toml, not several (a recipe can say from = \"REF\" itself): %w", errdefs.ErrInvalidArgument)
	}
	if len(bctx) > 0 {
		return nil, fmt.Errorf("context goes with a recipe's files or a Dockerfile's COPY, not with from: %w", errdefs.ErrInvalidArgument)
	}
	return recipe.FromRef(req.From, req.InsecureRegistry)
}

// buildContext checks a build context's files: paths inside it, each
// once, within recipe.MaxContextFiles and MaxContextBytes.
func buildContext(files []apiv1.ContextFile) (map[string]recipe.ContextFile, error) {
	if len(files) == 0 {
		return nil, nil
	}
	if len(files) > recipe.MaxContextFiles {
		return nil, fmt.Errorf("build context has %d files, at most %d: %w", len(files), recipe.MaxContextFiles, errdefs.ErrInvalidArgument)
	}
	out := make(map[string]recipe.ContextFile, len(files))
	var total int64
	for _, f := range files {
		p, err := recipe.ContextPath(f.Path)
		if err != nil || p == "." {
			return nil, fmt.Errorf("build context file %q: want a relative path inside the context: %w", f.Path, errdefs.ErrInvalidArgument)
		}
		if _, dup := out[p]; dup {
			return nil, fmt.Errorf("build context file %q is sent twice: %w", p, errdefs.ErrInvalidArgument)
		}
		if f.Mode&^0o7777 != 0 {
			return nil, fmt.Errorf("build context file %q: mode %o has bits beyond 07777: %w", p, f.Mode, errdefs.ErrInvalidArgument)
		}
		if total += int64(len(f.Data)); total > recipe.MaxContextBytes {
			return nil, fmt.Errorf("build context is larger than %d bytes: %w", recipe.MaxContextBytes, errdefs.ErrResourceExhausted)
		}
		out[p] = recipe.ContextFile{Mode: fs.FileMode(f.Mode).Perm(), Data: f.Data}
	}
	return out, nil
}

// buildImage starts a build as an operation and answers 202 with it; the
// build runs on the daemon's context, not the request's. An
// Idempotency-Key makes a retry answer the same operation.
func (s *Server) buildImage(w http.ResponseWriter, r *http.Request) {
	var req apiv1.BuildImageRequest
	if err := decodeUpTo(w, r, &req, MaxBuildBody); err != nil {
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
	rcp, err := s.buildRecipe(req.BuildSource)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	network, registry := policyOf(req.BuildNetwork), s.registryAccess(r, req.BuildSource, rcp.From)
	if err := s.Engine.CheckBuildNetwork(network); err != nil {
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
		img, err := s.Engine.BuildImageWith(ctx, slot, rcp, sandbox.BuildOptions{Progress: pr.Message, Network: network, Registry: registry})
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

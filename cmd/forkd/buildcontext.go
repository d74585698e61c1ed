package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/dockerfile"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// dockerfileRequest fills req from a Dockerfile and its context directory
// (args[0], default "."): the daemon never reads the client's files, so
// the ones COPY names travel in the request.
func dockerfileRequest(req *apiv1.BuildImageRequest, path string, args, buildArgs []string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("dockerfile: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	req.Dockerfile = string(data)
	if len(buildArgs) > 0 {
		req.BuildArgs = map[string]string{}
		for _, kv := range buildArgs {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("--build-arg %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
			}
			req.BuildArgs[k] = v
		}
	}
	// Parsed here too, for the COPY sources (and early, clear errors).
	f, err := dockerfile.Parse(filepath.Base(path), data, req.BuildArgs)
	if err != nil {
		return err
	}
	dir := "."
	if len(args) > 0 {
		dir = args[0]
	}
	req.Context, err = contextFiles(dir, f.Steps)
	return err
}

// recipeContext reads the files a recipe file's files table names,
// relative to the recipe's directory; a recipe named, not a path, has
// none to send.
func recipeContext(arg, toml string) ([]apiv1.ContextFile, error) {
	if toml == "" {
		return nil, nil
	}
	r, err := recipe.Parse(arg, []byte(toml))
	if err != nil {
		return nil, err
	}
	return contextFiles(filepath.Dir(arg), r.Steps)
}

func contextFiles(dir string, steps []recipe.Step) ([]apiv1.ContextFile, error) {
	files, err := recipe.ReadContext(dir, steps)
	if err != nil {
		return nil, err
	}
	out := make([]apiv1.ContextFile, 0, len(files))
	for p, f := range files {
		out = append(out, apiv1.ContextFile{Path: p, Mode: uint32(f.Mode.Perm()), Data: f.Data})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/pflag"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/dockerfile"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// buildFlags say what an image is built from: a recipe, --from REF or
// -f Dockerfile [CONTEXT], with --build-arg and --build-network. Shared
// by image build and snapshot create (which builds its image first).
type buildFlags struct {
	dockerfile string
	buildArgs  []string
	network    string
}

func (b *buildFlags) bind(f *pflag.FlagSet, src *apiv1.BuildSource) {
	f.StringVar(&src.From, "from", "", "build from an OCI or Docker image (REGISTRY/REPO[:TAG|@sha256:DIGEST]; credentials from ~/.docker/config.json) instead of a recipe")
	f.BoolVar(&src.InsecureRegistry, "insecure-registry", false, "allow a plain-HTTP registry or an untrusted TLS certificate for the image built from")
	f.StringVarP(&b.dockerfile, "file", "f", "", "build a Dockerfile (FROM, RUN, COPY/ADD of local files, ENV, WORKDIR, USER, ARG, CMD, ENTRYPOINT) in microVMs; CONTEXT (default .) is where COPY reads from")
	f.StringVar(&src.Name, "name", "", "with -f: the image's recipe name (default \"dockerfile\")")
	f.StringArrayVar(&b.buildArgs, "build-arg", nil, "with -f: KEY=VALUE overriding an ARG's default (repeatable)")
	f.StringVar(&b.network, "build-network", "", "egress policy of the build VMs that run RUN steps (default: the daemon's --network): "+policyHelp)
}

// fill completes src from the flags, the recipe (a name or a .toml file;
// "" when none was given) and the positional arguments left (CONTEXT).
func (b *buildFlags) fill(ctx context.Context, src *apiv1.BuildSource, recipeArg string, args []string) error {
	var err error
	if src.BuildNetwork, err = policyFlag(b.network); err != nil {
		return fmt.Errorf("--build-network: %w", err)
	}
	if b.dockerfile == "" && (len(b.buildArgs) > 0 || src.Name != "") {
		return fmt.Errorf("--build-arg and --name go with -f Dockerfile: %w", errdefs.ErrInvalidArgument)
	}
	sources := 0
	for _, set := range []bool{b.dockerfile != "", src.From != "", recipeArg != ""} {
		if set {
			sources++
		}
	}
	if sources != 1 {
		return fmt.Errorf("give one of a recipe, --from REF and -f Dockerfile: %w", errdefs.ErrInvalidArgument)
	}
	if len(args) > 0 && b.dockerfile == "" {
		return fmt.Errorf("a CONTEXT directory (%s) goes with -f Dockerfile; a recipe's files are read next to the recipe file: %w", args[0], errdefs.ErrInvalidArgument)
	}
	from := src.From
	switch {
	case b.dockerfile != "":
		if from, err = dockerfileRequest(src, b.dockerfile, args, b.buildArgs); err != nil {
			return err
		}
	case recipeArg != "":
		if src.Recipe, src.RecipeTOML, err = recipeFile(recipeArg); err != nil {
			return err
		}
		if src.Context, from, err = recipeContext(recipeArg, src.RecipeTOML); err != nil {
			return err
		}
	}
	return sendCredentials(ctx, src, from)
}

// sendCredentials adds the credentials this user's docker config holds
// for from's registry, as `forkd pull` sends them: a tenant's build uses
// only what it sends. A reference without a registry host (a Docker Hub
// short name) sends none.
func sendCredentials(ctx context.Context, src *apiv1.BuildSource, from string) error {
	if _, err := oci.ParseReference(from); err != nil {
		return nil // the daemon judges the reference
	}
	var err error
	src.RegistryUsername, src.RegistryPassword, err = oci.DockerCredential(ctx, from)
	return err
}

// dockerfileRequest fills req from a Dockerfile and its context directory
// (args[0], default "."): the daemon never reads the client's files, so
// the ones COPY names travel in the request.
func dockerfileRequest(req *apiv1.BuildSource, path string, args, buildArgs []string) (from string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("dockerfile: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	req.Dockerfile = string(data)
	if len(buildArgs) > 0 {
		req.BuildArgs = map[string]string{}
		for _, kv := range buildArgs {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return "", fmt.Errorf("--build-arg %q: want KEY=VALUE: %w", kv, errdefs.ErrInvalidArgument)
			}
			req.BuildArgs[k] = v
		}
	}
	// Parsed here too, for the COPY sources (and early, clear errors).
	f, err := dockerfile.Parse(filepath.Base(path), data, req.BuildArgs)
	if err != nil {
		return "", err
	}
	dir := "."
	if len(args) > 0 {
		dir = args[0]
	}
	req.Context, err = contextFiles(dir, f.Steps)
	return f.From, err
}

// recipeContext reads the files a recipe file's files table names,
// relative to the recipe's directory; a recipe named, not a path, has
// none to send.
// It also returns the recipe's from.
func recipeContext(arg, toml string) ([]apiv1.ContextFile, string, error) {
	if toml == "" {
		return nil, "", nil
	}
	r, err := recipe.Parse(arg, []byte(toml))
	if err != nil {
		return nil, "", err
	}
	files, err := contextFiles(filepath.Dir(arg), r.Steps)
	return files, r.From, err
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

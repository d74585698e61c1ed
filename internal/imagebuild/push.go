package imagebuild

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Push uploads the image of a docker-archive tarball (WriteArchive's, one
// image) to ref (REGISTRY/REPOSITORY:TAG), with the registry credentials
// of the docker configuration (`docker login`, $DOCKER_CONFIG:
// authn.DefaultKeychain), and returns its digest, which is the archive's:
// the image tested is the image pushed. Layers the registry holds already
// are not sent again, so a retry resumes. A registry on localhost or
// 127.0.0.1 is spoken to over HTTP; insecure allows that elsewhere too.
func Push(ctx context.Context, archive, ref string, insecure bool) (v1.Hash, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	dst, err := name.NewTag(ref, append(opts, name.StrictValidation)...)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push to %q: %w (want REGISTRY/REPOSITORY:TAG)", ref, err)
	}
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: reading the archive: %w (one image, as make images writes)", archive, err)
	}
	d, err := img.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", archive, err)
	}
	if err := remote.Write(dst, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s to %s: %w", archive, dst, err)
	}
	return d, nil
}

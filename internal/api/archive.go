package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/httpquery"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// maxArchiveBody bounds an import's request body: the largest archive
// Unpack accepts by default, plus room for the manifest and tar headers.
const maxArchiveBody = pack.DefaultMaxLogicalBytes + pack.DefaultMaxLogicalBytes>>10 + 64<<20

// archiveWriter sends the success headers on the first byte, so an error
// before any data (an unknown tag, a damaged snapshot) is still a problem
// response.
type archiveWriter struct {
	w       http.ResponseWriter
	tag     string
	started bool
}

func (a *archiveWriter) Write(p []byte) (int, error) {
	if !a.started {
		a.started = true
		h := a.w.Header()
		h.Set("Content-Type", pack.MediaType)
		h.Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s.forkd.tar.zst"`, a.tag))
		a.w.WriteHeader(http.StatusOK)
	}
	return a.w.Write(p)
}

// exportArchive streams a snapshot, with the image it boots (and, for a
// layer, every ancestor of its chain), as a portable archive
// (internal/pack). ?image=0 leaves the image's bytes out. The
// daemon does not sign: the CLI signs the stream with a key that stays on
// the client (pack.Sign).
func (s *Server) exportArchive(w http.ResponseWriter, r *http.Request) {
	tag := r.PathValue("tag")
	if err := snapshot.ValidateTag(tag); err != nil {
		writeProblem(w, r, err)
		return
	}
	withImage, err := httpquery.Bool(r.URL.Query(), "image", true)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	opts := pack.PackOptions{ExcludeImages: !withImage}
	aw := &archiveWriter{w: w, tag: tag}
	if _, err := pack.Pack(r.Context(), s.Engine.Config().DataDir, tag, aw, opts); err != nil {
		if !aw.started {
			writeProblem(w, r, err)
			return
		}
		// Mid-stream failure: cut the connection so the client cannot take
		// a partial archive for a whole one (Unpack would refuse it anyway).
		noteError(r, err)
		panic(http.ErrAbortHandler)
	}
}

// importArchive verifies an archive from the request body and adds its
// snapshot (and image, if new) under its tag, with the ancestors of a
// layer under theirs (reusing those here with the same digest): ?tag=
// renames the head, ?force=1 replaces existing tags atomically, ?verify_key= (an ed25519 public
// key, base64 of its 32 bytes) refuses archives it did not sign, and so
// does the daemon's import policy (Server.TrustedKeys, 403). Answers 201
// with the snapshot.
func (s *Server) importArchive(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := pack.UnpackOptions{Tag: q.Get("tag"), TrustedKeys: s.TrustedKeys}
	if opts.Tag != "" {
		if err := snapshot.ValidateNewTag(opts.Tag); err != nil {
			writeProblem(w, r, err)
			return
		}
	}
	force, err := httpquery.Bool(q, "force", false)
	if err != nil {
		writeProblem(w, r, err)
		return
	}
	opts.Force = force
	if p := s.principalOf(r); force && !p.Admin() {
		writeProblem(w, r, fmt.Errorf("%s may not import over existing tags (?force=true, `forkd unpack --force`): that needs the admin role; import under a new tag (?tag=, --tag) instead: %w", p, errdefs.ErrPermissionDenied))
		return
	}
	if k := q.Get("verify_key"); k != "" {
		key, err := pack.ParsePublicKey([]byte(k))
		if err != nil {
			writeProblem(w, r, fmt.Errorf("verify_key: %w", err))
			return
		}
		opts.VerifyKey = key
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != pack.MediaType && mt != "application/octet-stream") {
			writeProblem(w, r, fmt.Errorf("content type %q: send the archive as %s: %w", ct, pack.MediaType, errdefs.ErrInvalidArgument))
			return
		}
	}
	body := http.MaxBytesReader(w, r.Body, maxArchiveBody)
	snap, stats, err := pack.Unpack(r.Context(), s.Engine.Config().DataDir, body, opts)
	if err == nil {
		// A forced import replaced tags (the head's, or an ancestor's of a
		// chain): VMMs pooled for the old snapshots would restore the wrong
		// memory image.
		for _, id := range stats.ReplacedIDs {
			s.Engine.DropPool(r.Context(), id)
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			err = fmt.Errorf("archive over %d bytes: %w", maxArchiveBody, errdefs.ErrInvalidArgument)
		}
		writeProblem(w, r, err)
		return
	}
	// The importer's tenant owns every tag the import wrote: the head, and
	// the ancestors of a chain it added or replaced (those it reused stay
	// their owners').
	s.claimSnapshot(r, snap.Tag, snap.ID)
	noteTargets(r, snap.Tag)
	for _, tag := range append(stats.Added, stats.Replaced...) {
		if tag != snap.Tag { // ancestors of a chain this import added or replaced
			id := ""
			if a, err := s.Engine.Store().Get(tag); err == nil {
				id = a.ID
			}
			s.claimSnapshot(r, tag, id)
			noteTargets(r, tag)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(s.snapshotInfo(r, snap))
}

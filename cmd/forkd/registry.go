package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/oci"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// pushCmd is `forkd push TAG REF`: the daemon exports the archive, the
// CLI signs it (the key stays here) and uploads its parts
// (internal/oci), each only if the registry lacks it.
func pushCmd(g *globals) *cobra.Command {
	var signKey string
	var plainHTTP bool
	cmd := &cobra.Command{
		Use:   "push TAG REF",
		Short: "Push a snapshot (with its image and chain) to an OCI registry",
		Long: "Push a snapshot to an OCI registry as an artifact (host[:port]/repository:tag): the image and\n" +
			"each snapshot of a chain are blobs of their own, uploaded only if the registry lacks them.\n" +
			"Credentials come from the docker config (`docker login`). --sign signs it as `forkd pack` does.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			tag, ref := args[0], args[1]
			if err := snapshot.ValidateTag(tag); err != nil {
				return err
			}
			if err := oci.CheckReference(ref); err != nil {
				return err
			}
			key, err := readSignKey(signKey)
			if err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := g.reporter("push", false)
			if err != nil {
				return err
			}
			rep.Step("pushing snapshot " + tag + " to " + ref)
			pr, pw := io.Pipe()
			exported := make(chan error, 1)
			go func() {
				var err error
				if key == nil {
					_, err = c.ExportArchive(cmd.Context(), tag, pw, client.ExportOptions{})
				} else {
					err = exportSigned(cmd, c, tag, pw, key, false)
				}
				pw.CloseWithError(err)
				exported <- err
			}()
			stats, err := oci.Push(cmd.Context(), rep.Reader(pr, -1), ref, os.TempDir(), oci.Auth{PlainHTTP: plainHTTP}, rep.Step)
			pr.CloseWithError(err) // stops the export if the push failed first
			if eerr := <-exported; err == nil {
				err = eerr
			}
			rep.Done(err)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(map[string]any{"tag": tag, "ref": ref, "digest": stats.Digest, "uploaded": stats.Uploaded,
					"present": stats.Present, "uploaded_bytes": stats.UploadedBytes, "signed": stats.Signed})
			}
			fmt.Printf("pushed %s to %s (%s): %d parts uploaded (%s), %d already there\n", tag, ref, stats.Digest,
				len(stats.Uploaded), human(stats.UploadedBytes), len(stats.Present))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&signKey, "sign", "", "sign with this ed25519 private key (a PEM `file` from forkd pack keygen)")
	f.BoolVar(&plainHTTP, "plain-http", false, "allow plain HTTP to a registry not on loopback")
	return cmd
}

// pullCmd is `forkd pull REF [--tag T]`: the daemon fetches the parts it
// lacks and verifies the artifact under its import policy; the CLI sends
// the credentials its docker config holds for the registry.
func pullCmd(g *globals) *cobra.Command {
	var req apiv1.PullSnapshotRequest
	var verify string
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull a snapshot pushed with `forkd push` from an OCI registry",
		Long: "Pull a snapshot artifact into the daemon: only the parts it lacks (the image, each ancestor)\n" +
			"are fetched; every byte is verified, and signatures under the daemon's --trusted-keys policy.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Ref = args[0]
			if err := oci.CheckReference(req.Ref); err != nil {
				return err
			}
			if req.Tag != "" {
				if err := snapshot.ValidateNewTag(req.Tag); err != nil {
					return err
				}
			}
			if verify != "" {
				data, err := os.ReadFile(verify)
				if err != nil {
					return fmt.Errorf("verify key: %w: %w", err, errdefs.ErrInvalidArgument)
				}
				key, err := pack.ParsePublicKey(data)
				if err != nil {
					return fmt.Errorf("verify key %s: %w", verify, err)
				}
				req.VerifyKey = pack.EncodePublicKey(key)
			}
			var err error
			if req.Username, req.Password, err = oci.DockerCredential(cmd.Context(), req.Ref); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := g.reporter("pull", false)
			if err != nil {
				return err
			}
			rep.Step("pulling " + req.Ref)
			snap, err := c.PullSnapshot(cmd.Context(), req, rep.Step)
			rep.Done(err)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(snap)
			}
			fmt.Printf("pulled %s as snapshot %s\n", req.Ref, snap.Tag)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Tag, "tag", "", "local tag (default: the snapshot's own)")
	f.BoolVar(&req.Force, "force", false, "replace existing tags (admin)")
	f.BoolVar(&req.PlainHTTP, "plain-http", false, "allow plain HTTP to a registry not on loopback")
	f.StringVar(&verify, "verify", "", "refuse an artifact not signed by this ed25519 public key (a PEM `file`)")
	return cmd
}

// readSignKey reads an ed25519 private key file; nil without a path.
func readSignKey(path string) (ed25519.PrivateKey, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	key, err := pack.ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	return key, nil
}

// pullPolicyHelp describes --pull-policy of fork and run.
const pullPolicyHelp = "with a registry reference for --tag: if_not_present (the default: fork the copy pulled by an earlier fork of it, pulling only the first time) or always (ask the registry for its digest at each fork and pull when it moved)"

// forkSource checks a fork's --tag, a local tag or a registry reference
// (pulled by the daemon on first use), and for a reference sets the pull
// policy and the credentials this user's docker config holds for its
// registry, as `forkd pull` sends them.
func forkSource(ctx context.Context, req *apiv1.ForkRequest, policy string) error {
	if err := oci.CheckForkSource(req.Tag); err != nil {
		return err
	}
	if !oci.IsReference(req.Tag) {
		if policy != "" {
			return fmt.Errorf("--pull-policy applies to a registry reference (HOST/REPOSITORY:TAG), and %q is a local tag: drop it: %w", req.Tag, errdefs.ErrInvalidArgument)
		}
		return nil
	}
	if policy != "" && !slices.Contains(apiv1.PullPolicies, policy) {
		return fmt.Errorf("--pull-policy %q: want %s: %w", policy, strings.Join(apiv1.PullPolicies, " or "), errdefs.ErrInvalidArgument)
	}
	req.PullPolicy = policy
	var err error
	req.RegistryUsername, req.RegistryPassword, err = oci.DockerCredential(ctx, req.Tag)
	return err
}

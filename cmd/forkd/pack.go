package main

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/progress"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// packCmd is `forkd pack TAG -o FILE`: the daemon writes the archive, and
// the CLI signs it on the way to the file with a key that never leaves
// this host (pack.Sign rewrites only the archive's first frames).
func packCmd(g *globals) *cobra.Command {
	var out, signKey string
	var noImage bool
	cmd := &cobra.Command{
		Use:   "pack TAG -o FILE",
		Short: "Write a snapshot, with the image it boots, to one portable archive (tar + zstd)",
		Long: "Write a snapshot, with the image it boots, to one archive that `forkd unpack` verifies and adds\n" +
			"on another host. A layer (a diff branch) is packed with every ancestor of its chain.\n" +
			"--sign signs it with an ed25519 key made by `forkd pack keygen`.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tag := args[0]
			if err := snapshot.ValidateTag(tag); err != nil {
				return err
			}
			if out == "" {
				return fmt.Errorf("give the archive file with -o FILE (or -o - for stdout): %w", errdefs.ErrInvalidArgument)
			}
			var key ed25519.PrivateKey
			if signKey != "" {
				data, err := os.ReadFile(signKey)
				if err != nil {
					return fmt.Errorf("signing key: %w: %w", err, errdefs.ErrInvalidArgument)
				}
				if key, err = pack.ParsePrivateKey(data); err != nil {
					return fmt.Errorf("signing key %s: %w", signKey, err)
				}
			}
			if out == "-" {
				if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&fs.ModeCharDevice != 0 {
					return fmt.Errorf("refusing to write an archive to a terminal; redirect stdout or use -o FILE: %w", errdefs.ErrInvalidArgument)
				}
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := g.reporter("pack", out == "-")
			if err != nil {
				return err
			}
			// The archive's size is known only once written: zstd and
			// the pages stored as copies or left out make it a fraction
			// of the snapshot's bytes on disk, by a ratio no one knows
			// ahead. The bar shows bytes and rate, without a time left.
			rep.Step("packing snapshot " + tag + " into " + outputName(out))
			size, err := writeOutput(out, func(w io.Writer) error {
				w = rep.Writer(w, -1)
				if key == nil {
					_, err := c.ExportArchive(cmd.Context(), tag, w, client.ExportOptions{ExcludeImages: noImage})
					return err
				}
				return exportSigned(cmd, c, tag, w, key, noImage)
			})
			rep.Done(err)
			if err != nil {
				return err
			}
			if out == "-" {
				return nil
			}
			// The archive holds the chain as it was; what the daemon says
			// now only names it.
			var ancestors []string
			if info, err := c.Snapshot(cmd.Context(), tag); err == nil {
				ancestors = info.Ancestors
			}
			if g.jsonOut {
				res := map[string]any{"tag": tag, "file": out, "bytes": size, "signed": key != nil}
				if len(ancestors) > 0 {
					res["ancestors"] = ancestors
				}
				if key != nil {
					res["key"] = pack.Fingerprint(key.Public().(ed25519.PublicKey))
				}
				return printJSON(res)
			}
			signed := ""
			if key != nil {
				signed = ", signed by " + pack.Fingerprint(key.Public().(ed25519.PublicKey))
			}
			with := ""
			if len(ancestors) > 0 {
				with = " with its ancestors " + strings.Join(ancestors, ", ")
			}
			fmt.Printf("packed snapshot %s%s into %s (%s%s)\n", tag, with, out, human(size), signed)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&out, "output", "o", "", "archive file to write (- for stdout)")
	f.StringVar(&signKey, "sign", "", "sign with this ed25519 private key (a PEM `file` from forkd pack keygen)")
	f.BoolVar(&noImage, "no-image", false, "leave the image out; the receiving host must have it already")
	cmd.AddCommand(keygenCmd(g))
	return cmd
}

// exportSigned streams the daemon's archive through pack.Sign into w.
func exportSigned(cmd *cobra.Command, c *client.Client, tag string, w io.Writer, key ed25519.PrivateKey, noImage bool) error {
	pr, pw := io.Pipe()
	signed := make(chan error, 1)
	go func() {
		err := pack.Sign(pr, w, key)
		pr.CloseWithError(err) // unblocks the export if signing stopped early
		signed <- err
	}()
	_, err := c.ExportArchive(cmd.Context(), tag, pw, client.ExportOptions{ExcludeImages: noImage})
	pw.CloseWithError(err)
	if serr := <-signed; err == nil {
		err = serr
	}
	return err
}

// outputName is how progress names an output path ("-" is stdout).
func outputName(path string) string {
	if path == "-" {
		return "stdout"
	}
	return path
}

// writeOutput runs write into path through a temporary file that is
// renamed into place only when write succeeds ("-" is stdout).
func writeOutput(path string, write func(io.Writer) error) (int64, error) {
	if path == "-" {
		cw := &countWriter{w: os.Stdout}
		err := write(cw)
		return cw.n, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	cw := &countWriter{w: tmp}
	if err := write(cw); err != nil {
		tmp.Close()
		return 0, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return 0, err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return 0, err
	}
	if err := tmp.Close(); err != nil {
		return 0, err
	}
	return cw.n, os.Rename(tmp.Name(), path)
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// keygenCmd is `forkd pack keygen -o KEYBASE`.
func keygenCmd(g *globals) *cobra.Command {
	var base string
	cmd := &cobra.Command{
		Use:   "keygen -o KEYBASE",
		Short: "Make an ed25519 signing key: KEYBASE (private, 0600) and KEYBASE.pub",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if base == "" {
				return fmt.Errorf("give the key file with -o KEYBASE: %w", errdefs.ErrInvalidArgument)
			}
			priv, pub, err := pack.GenerateKey()
			if err != nil {
				return err
			}
			// O_EXCL: never overwrite a key someone may depend on.
			for _, f := range []struct {
				path string
				data []byte
				perm os.FileMode
			}{{base, priv, 0o600}, {base + ".pub", pub, 0o644}} {
				fh, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, f.perm)
				if errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("%s exists; remove it or choose another name: %w", f.path, errdefs.ErrAlreadyExists)
				}
				if err != nil {
					return err
				}
				_, err = fh.Write(f.data)
				if cerr := fh.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
			}
			key, err := pack.ParsePublicKey(pub)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(map[string]string{"private": base, "public": base + ".pub", "fingerprint": pack.Fingerprint(key)})
			}
			fmt.Printf("wrote %s (private, keep it secret) and %s (give it to `forkd unpack --verify`)\nfingerprint %s\n", base, base+".pub", pack.Fingerprint(key))
			return nil
		},
	}
	cmd.Flags().StringVarP(&base, "output", "o", "", "private key file; the public key goes to FILE.pub")
	return cmd
}

// unpackCmd is `forkd unpack FILE`.
func unpackCmd(g *globals) *cobra.Command {
	var opts client.ImportOptions
	var verify string
	cmd := &cobra.Command{
		Use:   "unpack FILE",
		Short: "Verify an archive from `forkd pack` and add its snapshot (and image) to the daemon",
		Long: "Verify an archive from `forkd pack` (every file's SHA-256, names, sizes; - reads stdin) and add its\n" +
			"snapshot under its tag, and its image if the daemon lacks it. Nothing appears unless all of it verifies.\n" +
			"A layer's ancestors come under their own tags; one already here with the same digest is reused,\n" +
			"one here with other content is refused unless --force (which refuses to break local layers on it).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if opts.Tag != "" {
				if err := snapshot.ValidateNewTag(opts.Tag); err != nil {
					return err
				}
			}
			if verify != "" {
				data, err := os.ReadFile(verify)
				if err != nil {
					return fmt.Errorf("verify key: %w: %w", err, errdefs.ErrInvalidArgument)
				}
				if opts.VerifyKey, err = pack.ParsePublicKey(data); err != nil {
					return fmt.Errorf("verify key %s: %w", verify, err)
				}
			}
			in, name := os.Stdin, "stdin"
			if args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return fmt.Errorf("archive: %w: %w", err, errdefs.ErrInvalidArgument)
				}
				defer f.Close()
				in, name = f, args[0]
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			rep, err := g.reporter("unpack", false)
			if err != nil {
				return err
			}
			rep.Step("sending " + name + " to the daemon")
			// Once all is sent, the daemon checks the whole and commits:
			// a step of its own, so a pause there is not a stalled upload.
			body := stepAtEOF(rep.Reader(in, regularSize(in)), rep, "daemon committing the snapshot")
			snap, err := c.ImportArchive(cmd.Context(), body, opts)
			rep.Done(err)
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(snap)
			}
			verified := ""
			if opts.VerifyKey != nil {
				verified = ", signature verified"
			}
			on := ""
			if len(snap.Ancestors) > 0 {
				on = ", a layer on " + strings.Join(snap.Ancestors, ", ")
			}
			fmt.Printf("unpacked snapshot %s (id %s, recipe %s, %s logical, %s on disk%s%s)\n", snap.Tag, snap.ID, snap.Recipe, human(snap.SizeBytes), human(snap.DiskBytes), on, verified)
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&opts.Force, "force", false, "replace existing snapshots with the same tags (the head, or ancestors with other content)")
	f.StringVar(&opts.Tag, "tag", "", "tag to create instead of the archive head's; ancestors keep theirs ("+snapshot.TagRule+")")
	f.StringVar(&verify, "verify", "", "refuse the archive unless signed by this ed25519 public key (the PEM `file` KEYBASE.pub)")
	return cmd
}

// regularSize is the size of f if it is a regular file (a total for
// progress), else -1: a pipe's size is unknown.
func regularSize(f *os.File) int64 {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return -1
	}
	return st.Size()
}

// stepAtEOF returns r starting the step next on rep when r ends.
func stepAtEOF(r io.Reader, rep *progress.Reporter, next string) io.Reader {
	return &eofStep{r: r, rep: rep, next: next}
}

type eofStep struct {
	r    io.Reader
	rep  *progress.Reporter
	next string
	done bool
}

func (e *eofStep) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF && !e.done {
		e.done = true
		e.rep.Step(e.next)
	}
	return n, err
}

// Command mkimage writes one of forkd's container images as a
// docker-archive tarball (internal/imagebuild); packaging/images.sh runs
// it for the node daemon's and the controller's images.
//
//	mkimage --out dist/images/forkd.tar --tag ghcr.io/forkd-dev/forkd:1.2.3 \
//	  [--rootfs rootfs.tar] [--file SRC:DST[:MODE]]... \
//	  [--entrypoint '["forkd"]'] [--cmd '["serve"]'] [--env K=V]... \
//	  [--user U] [--workdir D] [--label K=V]...
//	mkimage push [--insecure] ARCHIVE REGISTRY/REPOSITORY:TAG
//
// push uploads an archive's image with the docker configuration's
// credentials (`docker login`) and prints its digest
// (packaging/push-images.sh, `make push-images`).
//
// The creation time, and every added file's mtime, is SOURCE_DATE_EPOCH
// (seconds since 1970), else the Unix epoch: the same inputs give the
// same image.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/imagebuild"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	run := run
	if len(os.Args) > 1 && os.Args[1] == "push" {
		run = push
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run() error {
	var files, env, labels, tags list
	spec := imagebuild.Spec{}
	out := flag.String("out", "", "the docker-archive tarball to write")
	flag.StringVar(&spec.RootFS, "rootfs", "", "a root filesystem tarball, the first layer")
	flag.Var(&files, "file", "SRC:DST[:MODE] (octal), a file for the files layer; repeatable")
	entrypoint := flag.String("entrypoint", "", "the entrypoint, a JSON array of strings")
	cmd := flag.String("cmd", "", "the default arguments, a JSON array of strings")
	flag.Var(&env, "env", "K=V in the image's environment; repeatable")
	flag.StringVar(&spec.User, "user", "", "the user (and group) the entrypoint runs as, e.g. 65532:65532")
	flag.StringVar(&spec.WorkingDir, "workdir", "", "the working directory")
	flag.Var(&labels, "label", "K=V, an image label; repeatable")
	flag.Var(&tags, "tag", "REGISTRY/REPOSITORY:TAG the archive names the image by; repeatable, at least one")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		return fmt.Errorf("usage: mkimage --out FILE --tag REF [--rootfs TAR] [--file SRC:DST[:MODE]]... (see -h)")
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("--file %q: want SRC:DST or SRC:DST:MODE", f)
		}
		file := imagebuild.File{Src: parts[0], Dst: parts[1]}
		if len(parts) == 3 {
			m, err := strconv.ParseUint(parts[2], 8, 32)
			if err != nil || m > 0o777 {
				return fmt.Errorf("--file %q: mode %q: want octal permission bits such as 0755", f, parts[2])
			}
			file.Mode = os.FileMode(m)
		}
		spec.Files = append(spec.Files, file)
	}
	if err := jsonList("entrypoint", *entrypoint, &spec.Entrypoint); err != nil {
		return err
	}
	if err := jsonList("cmd", *cmd, &spec.Cmd); err != nil {
		return err
	}
	spec.Env = env
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		if spec.Labels == nil {
			spec.Labels = map[string]string{}
		}
		spec.Labels[k] = v
	}
	spec.Created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", s)
		}
		spec.Created = time.Unix(sec, 0).UTC()
	}
	img, err := imagebuild.Build(spec)
	if err != nil {
		return err
	}
	if err := imagebuild.WriteArchive(img, *out, tags...); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, d, strings.Join(tags, " "))
	return nil
}

// push is `mkimage push [--insecure] ARCHIVE REF`.
func push() error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	insecure := fs.Bool("insecure", false, "speak HTTP to the registry (localhost and 127.0.0.1 always are)")
	if err := fs.Parse(os.Args[2:]); err != nil {
		return err
	}
	if fs.NArg() != 2 {
		return fmt.Errorf("usage: mkimage push [--insecure] ARCHIVE REGISTRY/REPOSITORY:TAG")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, err := imagebuild.Push(ctx, fs.Arg(0), fs.Arg(1), *insecure)
	if err != nil {
		return err
	}
	fmt.Printf("%s@%s\n", fs.Arg(1), d)
	return nil
}

// jsonList decodes flag --name's value, a JSON array of strings, into dst.
func jsonList(name, v string, dst *[]string) error {
	if v == "" {
		return nil
	}
	if err := json.Unmarshal([]byte(v), dst); err != nil {
		return fmt.Errorf("--%s %q: want a JSON array of strings, such as [\"forkd\"]: %v", name, v, err)
	}
	return nil
}

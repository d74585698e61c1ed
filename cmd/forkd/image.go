package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

func imageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build, list and remove guest images"}
	var of opFlags
	var req apiv1.BuildImageRequest
	var bf buildFlags
	build := &cobra.Command{
		Use:   "build RECIPE | --from REF | -f Dockerfile [CONTEXT]",
		Short: "Build (or find cached) the image of a recipe, an OCI image or a Dockerfile: kernel, initramfs with forkd-agent, read-only root fs",
		Long: "Build (or find cached) a guest image. A recipe's run, files, env, workdir and user, and a\n" +
			"Dockerfile's FROM, RUN, COPY/ADD of local files, ENV, WORKDIR, USER, ARG, CMD and ENTRYPOINT, run as build\n" +
			"steps in microVMs (with --build-network's egress, default the daemon's); each step is\n" +
			"cached by its inputs, so a rebuild runs only the steps from the first changed one. CONTEXT\n" +
			"(default .) is the directory COPY sources are read from; a recipe's files are read\n" +
			"relative to the recipe file.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			recipeArg := ""
			if req.From == "" && bf.dockerfile == "" && len(args) > 0 {
				recipeArg, args = args[0], args[1:]
			}
			if err := bf.fill(cmd.Context(), &req.BuildSource, recipeArg, args); err != nil {
				return err
			}
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			op, err := c.StartBuildImage(cmd.Context(), req, "")
			if err != nil {
				return err
			}
			var img apiv1.Image
			if done, err := printedOr(followOperation(cmd.Context(), g, c, op, of.detach, &img)); done {
				return err
			}
			fmt.Printf("image %s (recipe %s, kernel %s, %s) in %s\n", img.Digest[:12], img.Recipe, img.KernelVersion, human(img.SizeBytes), img.Dir)
			if img.From != "" {
				fmt.Printf("from %s (%s)\n", img.From, img.FromDigest)
			}
			return nil
		},
	}
	of.bind(build)
	bf.bind(build.Flags(), &req.BuildSource)
	ls := imagesCmd(g)
	ls.Use = "ls"
	cmd.AddCommand(build, ls, imageRmCmd(g))
	return cmd
}

func imagesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use: "images", Short: "List built images", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			imgs, err := c.Images(cmd.Context())
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(imgs)
			}
			tw := table("DIGEST\tRECIPE\tKERNEL\tMEMORY\tSIZE\tCREATED")
			for _, i := range imgs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d MiB\t%s\t%s\n", i.Digest[:12], i.Recipe, i.KernelVersion, i.MemoryMiB, human(i.SizeBytes), i.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
}

// imageRmCmd is `forkd image rm DIGEST|RECIPE...` (and `forkd rmi` for
// snapshot tags stays as it was).
func imageRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm DIGEST|RECIPE...",
		Aliases: []string{"remove", "delete"},
		Short:   "Remove images no snapshot was taken from (a recipe name: its newest image)",
		Long: "Remove images by digest, unique digest prefix, or recipe name (its newest image).\n" +
			"An image a snapshot was taken from is refused, naming the snapshots: remove them\n" +
			"first (forkd rmi TAG). `forkd system prune --images` removes every unused image.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			var removed []apiv1.Image
			for _, ref := range args {
				img, err := c.RemoveImage(cmd.Context(), ref)
				if err != nil {
					return err
				}
				removed = append(removed, img)
				if !g.jsonOut {
					fmt.Printf("removed image %s (recipe %s, %s)\n", shortDigest(img.Digest), img.Recipe, human(img.SizeBytes))
				}
			}
			if g.jsonOut {
				return printJSON(map[string]any{"removed": removed})
			}
			return nil
		},
	}
}

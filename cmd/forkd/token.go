package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/auth"
)

// tokenCmd manages the bearer tokens of the TCP API. It edits the store
// file directly (root only); a running daemon sees changes on its next
// request.
func tokenCmd(g *globals) *cobra.Command {
	var store string
	open := func() (*auth.Tokens, error) {
		if store == "" {
			store = filepath.Join(g.dataDir, auth.StoreFile)
		}
		return auth.Open(store)
	}
	cmd := &cobra.Command{Use: "token", Short: "Manage API tokens for `forkd serve --listen`"}
	cmd.PersistentFlags().StringVar(&store, "token-file", "", "token store (default DATA_DIR/"+auth.StoreFile+")")
	cmd.AddCommand(&cobra.Command{
		Use: "create NAME", Short: "Create a token and print it (shown only once)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := open()
			if err != nil {
				return err
			}
			plain, err := t.Create(args[0])
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(map[string]string{"name": args[0], "token": plain})
			}
			fmt.Println(plain)
			return nil
		},
	}, &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List tokens (names and creation times; secrets are not stored)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := open()
			if err != nil {
				return err
			}
			if g.jsonOut {
				return json.NewEncoder(os.Stdout).Encode(t.List())
			}
			for _, e := range t.List() {
				fmt.Printf("%-24s %s  sha256:%s…\n", e.Name, e.Created.Format("2006-01-02 15:04:05Z"), e.SHA256[:12])
			}
			return nil
		},
	}, &cobra.Command{
		Use: "revoke NAME", Short: "Revoke a token (the daemon refuses it from its next request)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := open()
			if err != nil {
				return err
			}
			if err := t.Revoke(args[0]); err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(map[string]string{"revoked": args[0]})
			}
			fmt.Println("revoked", args[0])
			return nil
		},
	})
	return cmd
}

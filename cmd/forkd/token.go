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
	var role, tenant string
	create := &cobra.Command{
		Use:   "create NAME [--role admin|user|read-only] [--tenant TENANT]",
		Short: "Create a token and print it (shown only once)",
		Long: "Create a token and print it (shown only once). A token acts for one tenant: it sees and touches\n" +
			"only that tenant's sandboxes, snapshots and operations, unless it is an admin.\n\n" +
			"Roles: admin (everything, every tenant, daemon-wide routes), user (fork, run, snapshot within\n" +
			"its tenant), read-only (read its tenant's objects). The default is user, and the default tenant\n" +
			"is the token's own name, so a new token is isolated unless it is told to join a tenant.\n" +
			"An admin's default tenant is \"" + auth.DefaultTenant + "\" (that of the Unix socket and the first token).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r, err := auth.ParseRole(role)
			if err != nil {
				return err
			}
			t, err := open()
			if err != nil {
				return err
			}
			plain, err := t.Create(args[0], r, tenant)
			if err != nil {
				return err
			}
			e := findToken(t, args[0])
			if g.jsonOut {
				return printJSON(map[string]string{"name": args[0], "token": plain, "role": string(e.Role), "tenant": e.Tenant})
			}
			fmt.Println(plain)
			fmt.Fprintf(os.Stderr, "token %s: %s of tenant %s\n", args[0], e.Role, e.Tenant)
			return nil
		},
	}
	create.Flags().StringVar(&role, "role", string(auth.RoleUser), "admin, user or read-only")
	create.Flags().StringVar(&tenant, "tenant", "", "tenant the token acts for (default: the token's name; \""+auth.DefaultTenant+"\" for an admin)")
	cmd.AddCommand(create, &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List tokens (names, roles, tenants and creation times; secrets are not stored)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := open()
			if err != nil {
				return err
			}
			if g.jsonOut {
				return json.NewEncoder(os.Stdout).Encode(t.List())
			}
			tw := table("NAME\tROLE\tTENANT\tCREATED\tSHA256")
			for _, e := range t.List() {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\tsha256:%s…\n", e.Name, e.Role, e.Tenant, e.Created.Format("2006-01-02 15:04:05Z"), e.SHA256[:12])
			}
			return tw.Flush()
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

// findToken returns the stored entry named name.
func findToken(t *auth.Tokens, name string) auth.Entry {
	for _, e := range t.List() {
		if e.Name == name {
			return e
		}
	}
	return auth.Entry{Name: name}
}

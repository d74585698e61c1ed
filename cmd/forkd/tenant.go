package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// snapshotShareCmds are `forkd snapshot share|unshare TAG --tenant T`.
func snapshotShareCmds(g *globals) []*cobra.Command {
	mk := func(share bool) *cobra.Command {
		var tenant string
		use, short := "share TAG --tenant TENANT", "Share a snapshot your tenant owns with another tenant, read-only (it may see and fork it)"
		if !share {
			use, short = "unshare TAG --tenant TENANT", "Stop sharing a snapshot with a tenant (what it already made from it stays its own)"
		}
		cmd := &cobra.Command{
			Use: use, Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := snapshot.ValidateTag(args[0]); err != nil {
					return err
				}
				c, err := g.client(cmd.Context())
				if err != nil {
					return err
				}
				call := c.ShareSnapshot
				if !share {
					call = c.UnshareSnapshot
				}
				s, err := call(cmd.Context(), args[0], tenant)
				if err != nil {
					return err
				}
				if g.jsonOut {
					return printJSON(s)
				}
				fmt.Printf("snapshot %s (tenant %s) shared with: %s\n", s.Tag, s.Owner, sharedList(s.SharedWith))
				return nil
			},
		}
		cmd.Flags().StringVar(&tenant, "tenant", "", "the other tenant ('*': every tenant)")
		cmd.MarkFlagRequired("tenant")
		return cmd
	}
	return []*cobra.Command{mk(true), mk(false)}
}

func sharedList(tenants []string) string {
	if len(tenants) == 0 {
		return "nobody"
	}
	return strings.Join(tenants, ", ")
}

// tenantCmd shows tenants and sets their quotas through the daemon.
func tenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Show tenants (quotas and use) and set their quotas"}
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List tenants with their quotas and use (a non-admin token sees its own)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			list, err := c.Tenants(cmd.Context())
			if err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(list)
			}
			tw := table("TENANT\tSANDBOXES\tMEMORY\tBUILDS\tQUOTA")
			for _, t := range list {
				fmt.Fprintf(tw, "%s\t%d\t%d MiB\t%d\t%s\n", t.Name, t.Usage.Sandboxes, t.Usage.MemoryMiB, t.Usage.Builds, quotaText(t))
			}
			return tw.Flush()
		},
	}
	var maxSandboxes, maxBuilds int
	var maxMemory int64
	quota := &cobra.Command{
		Use:   "quota TENANT [--max-sandboxes N] [--max-memory-mib MIB] [--max-builds N]",
		Short: "Show or set a tenant's quota ('*': the default for tenants without one; 0: no bound); admin only",
		Long: "Show or set a tenant's quota: its running and starting sandboxes, the guest memory they\n" +
			"commit, and its snapshot creations (and image builds) at once. A fork or creation past it is\n" +
			"refused (429). Without --max-builds a tenant may hold all of the daemon's --max-builds slots\n" +
			"but one (at least one), so that it cannot starve the others; --max-builds replaces that rule.\n" +
			"Flags not given keep their value; 0 removes a bound. TENANT '*' is the default quota of every\n" +
			"tenant without its own. Admins are never held to one.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			cur, err := c.Tenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("max-sandboxes") || f.Changed("max-memory-mib") || f.Changed("max-builds") {
				q := cur.Quota
				if cur.QuotaDefault {
					q = apiv1.Quota{} // the tenant's own starts empty
				}
				if f.Changed("max-sandboxes") {
					q.MaxSandboxes = maxSandboxes
				}
				if f.Changed("max-memory-mib") {
					q.MaxMemoryMiB = maxMemory
				}
				if f.Changed("max-builds") {
					q.MaxBuilds = maxBuilds
				}
				if cur, err = c.SetQuota(cmd.Context(), args[0], q); err != nil {
					return err
				}
			}
			if g.jsonOut {
				return printJSON(cur)
			}
			fmt.Printf("tenant %s: %s; in use: %d sandboxes, %d MiB, %d builds\n", cur.Name, quotaText(cur), cur.Usage.Sandboxes, cur.Usage.MemoryMiB, cur.Usage.Builds)
			return nil
		},
	}
	quota.Flags().IntVar(&maxSandboxes, "max-sandboxes", 0, "most running and starting sandboxes (0: no bound)")
	quota.Flags().Int64Var(&maxMemory, "max-memory-mib", 0, "most guest memory they commit, in MiB (0: no bound)")
	quota.Flags().IntVar(&maxBuilds, "max-builds", 0, "most snapshot creations and image builds at once (0: all the daemon's slots but one)")
	cmd.AddCommand(ls, quota)
	return cmd
}

// quotaText says a tenant's quota in words.
func quotaText(t apiv1.Tenant) string {
	q := t.Quota
	if q == (apiv1.Quota{}) {
		return "no quota"
	}
	bound := func(n int64, unit string) string {
		if n == 0 {
			return "no bound"
		}
		return fmt.Sprintf("%d%s", n, unit)
	}
	builds := "builds: the daemon's slots but one"
	if q.MaxBuilds > 0 {
		builds = fmt.Sprintf("max %d builds", q.MaxBuilds)
	}
	s := fmt.Sprintf("max %s sandboxes, max %s, %s", bound(int64(q.MaxSandboxes), ""), bound(q.MaxMemoryMiB, " MiB"), builds)
	if t.QuotaDefault {
		s += " (the default quota)"
	}
	return s
}

package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// networkFlags are the daemon's networking settings (serve and bench).
type networkFlags struct {
	policy        string
	pool          string
	hostNS        string
	dnsUpstream   string
	allowReserved bool
}

const policyHelp = "none, public, or allow:ENTRY,ENTRY (CIDR or ADDR[:PORT[-PORT]][/tcp|/udp], domain, *.domain)"

func addNetworkFlags(f *pflag.FlagSet, n *networkFlags) {
	f.StringVar(&n.policy, "network", envOr("FORKD_NETWORK", "public"),
		"default egress policy of sandboxes whose fork and snapshot name none (env FORKD_NETWORK): "+policyHelp+
			"; public is the internet but never the host, other sandboxes, private, CGNAT, link-local or multicast ranges")
	f.StringVar(&n.pool, "network-pool", envOr("FORKD_NETWORK_POOL", egress.DefaultPool), "IPv4 network sandbox uplinks are numbered from, one /30 each (a /16 holds 16,384; env FORKD_NETWORK_POOL)")
	f.StringVar(&n.hostNS, "network-host-netns", os.Getenv("FORKD_NETWORK_HOST_NETNS"), "network namespace (a path such as /run/netns/uplink) sandbox traffic leaves through (env FORKD_NETWORK_HOST_NETNS; default: the daemon's own)")
	f.StringVar(&n.dnsUpstream, "network-dns-upstream", os.Getenv("FORKD_NETWORK_DNS_UPSTREAM"), "DNS server HOST:PORT allowed names are resolved with (env FORKD_NETWORK_DNS_UPSTREAM; default: the first nameserver of /etc/resolv.conf)")
	f.BoolVar(&n.allowReserved, "network-allow-reserved", false, "let egress policies open private, loopback, link-local and multicast ranges (off: only public addresses can be allowed)")
}

// config turns the flags into the engine's settings.
func (n *networkFlags) config() (sandbox.NetworkConfig, error) {
	if n.policy == "" {
		return sandbox.NetworkConfig{}, nil // a command without the flags (bench): none
	}
	p, err := egress.ParseSpec(n.policy)
	if err != nil {
		return sandbox.NetworkConfig{}, fmt.Errorf("--network: %w", err)
	}
	return sandbox.NetworkConfig{Default: p, Pool: n.pool, HostNS: n.hostNS, DNSUpstream: n.dnsUpstream, AllowReserved: n.allowReserved}, nil
}

// policyFlag parses a --network value given to fork or snapshot create;
// nil when not given.
func policyFlag(s string) (*apiv1.NetworkPolicy, error) {
	if s == "" {
		return nil, nil
	}
	p, err := egress.ParseSpec(s)
	if err != nil {
		return nil, fmt.Errorf("--network: %w", err)
	}
	return &apiv1.NetworkPolicy{Mode: string(p.Mode), Allow: p.Allow}, nil
}

// limitFlags are --max-connections and --rate-mbit, which go with a
// --network policy.
type limitFlags struct{ conns, mbit int }

func addLimitFlags(f *pflag.FlagSet, l *limitFlags) {
	f.IntVar(&l.conns, "max-connections", 0, "cap on the TCP connections a sandbox has open through its uplink at once (0: none)")
	f.IntVar(&l.mbit, "rate-mbit", 0, "cap on a sandbox's traffic through its uplink, each way, in Mbit/s (0: none)")
}

// apply sets the caps on p; caps without a policy are an error.
func (l limitFlags) apply(p *apiv1.NetworkPolicy) error {
	if l.conns == 0 && l.mbit == 0 {
		return nil
	}
	if p == nil {
		return fmt.Errorf("--max-connections and --rate-mbit go with a --network policy (e.g. --network public): %w", errdefs.ErrInvalidArgument)
	}
	p.MaxConnections, p.RateMbit = l.conns, l.mbit
	return nil
}

// sandboxNetworkCmd is `forkd sandbox network ID [POLICY]`.
func sandboxNetworkCmd(g *globals) *cobra.Command {
	var limits limitFlags
	cmd := &cobra.Command{
		Use:   "network ID [POLICY]",
		Short: "Show a sandbox's egress policy and traffic, or change it (" + policyHelp + ")",
		Example: "  forkd sandbox network sb-0123456789\n" +
			"  forkd sandbox network sb-0123456789 none\n" +
			"  forkd sandbox network sb-0123456789 'allow:pypi.org,*.pythonhosted.org,198.51.100.0/24:443/tcp'",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client(cmd.Context())
			if err != nil {
				return err
			}
			var n apiv1.SandboxNetwork
			if len(args) == 2 {
				p, err := policyFlag(args[1])
				if err != nil {
					return err
				}
				if err := limits.apply(p); err != nil {
					return err
				}
				n, err = c.SetNetwork(cmd.Context(), args[0], *p)
				if err != nil {
					return err
				}
			} else if n, err = c.Network(cmd.Context(), args[0]); err != nil {
				return err
			}
			if g.jsonOut {
				return printJSON(n)
			}
			printNetwork(os.Stdout, n)
			return nil
		},
	}
	addLimitFlags(cmd.Flags(), &limits)
	return cmd
}

func policyString(p apiv1.NetworkPolicy) string {
	return egress.Policy{Mode: egress.Mode(p.Mode), Allow: p.Allow, MaxConnections: p.MaxConnections, RateMbit: p.RateMbit}.String()
}

func printNetwork(w io.Writer, n apiv1.SandboxNetwork) {
	fmt.Fprintf(w, "%-14s%s\n", "policy:", policyString(n.Policy))
	if s := n.Stats; s != nil {
		fmt.Fprintf(w, "%-14s%s in %d packets\n", "sent:", human(int64(s.TxBytes)), s.TxPackets)
		fmt.Fprintf(w, "%-14s%s in %d packets\n", "received:", human(int64(s.RxBytes)), s.RxPackets)
		fmt.Fprintf(w, "%-14s%d packets refused by the policy, %d with a spoofed source\n", "dropped:", s.DeniedPackets, s.SpoofedPackets)
	}
}

// networkChecks are what sandbox networking needs on the host (forkd
// doctor): skipped when sandboxes are closed rooms by default.
func networkChecks(g *globals) []apiv1.Check {
	if g.network.policy == string(egress.ModeNone) {
		return nil
	}
	pool := g.network.pool
	if pool == "" {
		pool = egress.DefaultPool
	}
	var out []apiv1.Check
	for _, c := range egress.HostChecks(g.network.hostNS, pool) {
		out = append(out, apiv1.Check{Name: "network: " + c.Name, OK: c.OK, Detail: c.Detail, Fix: c.Fix})
	}
	return out
}

package egress

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/forkd-dev/forkd/internal/netns"
)

// Check is one prerequisite of sandbox networking, as forkd doctor shows it.
type Check struct {
	Name   string
	OK     bool
	Detail string
	Fix    string // what to do when !OK
}

// HostChecks looks at what sandbox networking needs in the host namespace
// (hostNS; "" for the process's own), changing nothing that stays: nf_tables
// with NAT (a throwaway table is added and removed in one transaction),
// IPv4 forwarding (on, or able to be turned on), a default route, and no
// other firewall dropping forwarded packets (Docker's FORWARD policy is
// the usual one).
func HostChecks(hostNS string, pool string) []Check {
	var out []Check
	add := func(name string, ok bool, detail, fix string) {
		c := Check{Name: name, OK: ok, Detail: detail}
		if !ok {
			c.Fix = fix
		}
		out = append(out, c)
	}

	nc, done, err := nftConn(hostNS)
	if err == nil {
		t := nc.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "forkd-doctor"})
		ch := nc.AddChain(&nftables.Chain{Name: "post", Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
		nc.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{&expr.Masq{}}})
		nc.DelTable(t)
		err = nc.Flush()
		done()
	}
	add("nf_tables", err == nil, orElse(err, "tables, NAT and masquerade work"),
		"load the modules (modprobe nf_tables nft_chain_nat nft_masq nft_reject_ipv4); in a container, give forkd CAP_NET_ADMIN")

	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	on := err == nil && strings.TrimSpace(string(fwd)) == "1"
	switch {
	case on:
		add("ip forwarding", true, "net.ipv4.ip_forward = 1", "")
	default:
		f, werr := os.OpenFile("/proc/sys/net/ipv4/ip_forward", os.O_WRONLY, 0)
		if werr == nil {
			f.Close()
		}
		add("ip forwarding", werr == nil, "net.ipv4.ip_forward = 0; forkd turns it on when the first sandbox gets an uplink",
			"sysctl -w net.ipv4.ip_forward=1 (and in /etc/sysctl.d/ to keep it); /proc/sys is read-only here: "+orElse(werr, ""))
	}

	h, err := netns.RouteHandle(hostNS)
	var routes []netlink.Route
	if err == nil {
		routes, err = h.RouteList(nil, netlink.FAMILY_V4)
		h.Close()
	}
	defaults := 0
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && r.Dst.Mask.String() == "00000000" {
			defaults++
		}
	}
	add("default route", defaults > 0, fmt.Sprintf("%d IPv4 default routes", defaults),
		"sandboxes with a public or allow policy leave through the host's default route: add one, or run with --network none, or --network-host-netns NS with a route out")

	if nc, done, err := nftConn(hostNS); err == nil {
		chains, _ := nc.ListChains()
		done()
		var droppers []string
		for _, c := range chains {
			if c.Hooknum != nil && *c.Hooknum == *nftables.ChainHookForward && c.Policy != nil && *c.Policy == nftables.ChainPolicyDrop && !strings.HasPrefix(c.Table.Name, "forkd") {
				droppers = append(droppers, c.Table.Name+"/"+c.Name)
			}
		}
		add("forwarding firewall", len(droppers) == 0, orElse(errors.New(strings.Join(droppers, ", ")+" drop forwarded packets by default"), "no other forward chain drops by default"),
			"let the sandbox pool through, e.g. for Docker's: iptables -I DOCKER-USER -s "+pool+" -j ACCEPT && iptables -I DOCKER-USER -d "+pool+" -j ACCEPT")
		if len(droppers) == 0 {
			out[len(out)-1].Detail = "no other forward chain drops by default"
		}
	}
	return out
}

func orElse(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

package egress

import (
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/netns"
)

// HostLinkPrefix starts the host-side name of every sandbox uplink.
const HostLinkPrefix = "fkv"

// HostLinkName is the host side of sandbox id's uplink ("fkv" and the
// id's random part: 13 bytes for sb-xxxxxxxxxx).
func HostLinkName(sandboxID string) string {
	name := HostLinkPrefix + strings.TrimPrefix(sandboxID, "sb-")
	if len(name) > unix.IFNAMSIZ-1 {
		name = name[:unix.IFNAMSIZ-1]
	}
	return name
}

// Host is the host side of an engine's sandbox networking: forwarding on,
// and one nftables table (named after the engine) that masquerades the
// pool's traffic toward the host's routes and drops what sandboxes send
// to the host itself, to each other, or what arrives for them unasked.
type Host struct {
	// NS is the host namespace's bind mount; "" for the process's own.
	NS    string
	Table string
	Pool  *Pool
}

// Install enables forwarding and replaces the engine's host table.
func (h *Host) Install() error {
	if err := netns.SetForwarding(h.NS); err != nil {
		return fmt.Errorf("egress: host: %w (forkd doctor)", err)
	}
	nc, done, err := h.conn()
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: h.Table}
	nc.AddTable(t)
	nc.DelTable(t)
	nc.AddTable(t)
	accept := nftables.ChainPolicyAccept
	// Before other filters (priority filter - 10): a host firewall that
	// accepts everything must not let a sandbox reach the host first.
	in := nc.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10), Policy: &accept})
	fwd := nc.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 10), Policy: &accept})
	post := nc.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	add := func(ch *nftables.Chain, ex ...expr.Any) { nc.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ex}) }
	drop := []expr.Any{verdict(expr.VerdictDrop)}
	pool := h.Pool.Network()

	// The host's own addresses, all of them, are not for sandboxes
	// (refused at once rather than left to time out).
	add(in, cat(ifprefix(true, HostLinkPrefix, false), l4proto(unix.IPPROTO_TCP), []expr.Any{rejectTCP()})...)
	add(in, cat(ifprefix(true, HostLinkPrefix, false), []expr.Any{rejectICMP()})...)
	// No sandbox reaches another, and none is reached unasked.
	add(fwd, cat(ifprefix(true, HostLinkPrefix, false), ifprefix(false, HostLinkPrefix, false), drop)...)
	add(fwd, cat(ifprefix(false, HostLinkPrefix, false), ctEstablished(), []expr.Any{verdict(expr.VerdictAccept)})...)
	add(fwd, cat(ifprefix(false, HostLinkPrefix, false), drop)...)
	// Leaving: the host's address, not the pool's.
	add(post, cat(ipaddr(true, pool, false), ifprefix(false, HostLinkPrefix, true), []expr.Any{&expr.Masq{}})...)
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("egress: host table %s: %w", h.Table, err)
	}
	return nil
}

// Remove deletes the engine's host table (none there is no error).
func (h *Host) Remove() error { return RemoveHostTable(h.NS, h.Table) }

// HostTables lists the names of the forkd tables in the host namespace at
// hostNS ("" for the process's own), to find those of engines that are
// gone.
func HostTables(hostNS string) ([]string, error) {
	nc, done, err := nftConn(hostNS)
	if err != nil {
		return nil, err
	}
	defer done()
	tables, err := nc.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range tables {
		if strings.HasPrefix(t.Name, "forkd") {
			out = append(out, t.Name)
		}
	}
	return out, nil
}

// RemoveHostTable deletes an engine's host table (none there is no error).
func RemoveHostTable(hostNS, name string) error {
	nc, done, err := nftConn(hostNS)
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: name}
	nc.AddTable(t)
	nc.DelTable(t)
	return nc.Flush()
}

func (h *Host) conn() (*nftables.Conn, func(), error) { return nftConn(h.NS) }

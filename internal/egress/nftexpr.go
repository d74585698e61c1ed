package egress

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The expression helpers build the few matches forkd's rules use. Each
// loads into register 1 and compares; a rule is their concatenation
// followed by a verdict.

// ifname matches an interface name exactly (iif=true: input, else output).
func ifname(iif bool, name string, neq bool) []expr.Any {
	key := expr.MetaKeyOIFNAME
	if iif {
		key = expr.MetaKeyIIFNAME
	}
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: cmpOp(neq), Register: 1, Data: b}}
}

// ifprefix matches an interface whose name starts with prefix.
func ifprefix(iif bool, prefix string, neq bool) []expr.Any {
	key := expr.MetaKeyOIFNAME
	if iif {
		key = expr.MetaKeyIIFNAME
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: cmpOp(neq), Register: 1, Data: []byte(prefix)}}
}

func cmpOp(neq bool) expr.CmpOp {
	if neq {
		return expr.CmpOpNeq
	}
	return expr.CmpOpEq
}

// ipaddr matches the IPv4 source (src) or destination address against a
// prefix.
func ipaddr(src bool, p netip.Prefix, neq bool) []expr.Any {
	off := uint32(16)
	if src {
		off = 12
	}
	ex := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}}
	if p.Bits() < 32 {
		mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
		ex = append(ex, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	a := p.Masked().Addr().As4()
	return append(ex, &expr.Cmp{Op: cmpOp(neq), Register: 1, Data: a[:]})
}

// daddrIn matches the IPv4 destination against a named set.
func daddrIn(set string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set},
	}
}

// l4proto matches the transport protocol (unix.IPPROTO_TCP, ...).
func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

// dports matches a TCP or UDP destination port range (after l4proto).
func dports(lo, hi uint16) []expr.Any {
	ld := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if lo == hi {
		return []expr.Any{ld, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(lo)}}
	}
	return []expr.Any{ld, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: binaryutil.BigEndian.PutUint16(lo), ToData: binaryutil.BigEndian.PutUint16(hi)}}
}

// ctEstablished matches packets of established or related connections.
func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ctNew matches the first packet of a TCP connection (a rejectTCP after
// it refuses the connection at once).
func ctNew() []expr.Any {
	return cat(l4proto(unix.IPPROTO_TCP), []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	})
}

// count adds to the named counter object.
func count(name string) expr.Any { return &expr.Objref{Type: 1 /* NFT_OBJECT_COUNTER */, Name: name} }

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func jump(chain string) expr.Any { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

// rejectTCP answers with a TCP reset; rejectICMP with "administratively
// prohibited", so a denied connection fails at once instead of timing out.
func rejectTCP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_TCP_RST} }

func rejectICMP() expr.Any { return &expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13} }

// dnat4 rewrites the destination to addr:port.
func dnat4(addr netip.Addr, port uint16) []expr.Any {
	a := addr.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}

// intervals are the elements of an IPv4 interval set holding ps: each
// run of overlapping or adjacent prefixes becomes one start element and
// an end element just past it (none for a run that reaches
// 255.255.255.255), as the kernel's interval sets want them.
func intervals(ps []netip.Prefix) []nftables.SetElement {
	type run struct{ lo, hi uint32 } // inclusive
	runs := make([]run, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		lo := binary.BigEndian.Uint32(p.Addr().AsSlice())
		runs = append(runs, run{lo, lo | (^uint32(0) >> p.Bits())})
	}
	slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.lo, b.lo) })
	var merged []run
	for _, r := range runs {
		if n := len(merged); n > 0 && (merged[n-1].hi == ^uint32(0) || r.lo <= merged[n-1].hi+1) {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	var out []nftables.SetElement
	for _, r := range merged {
		out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.lo)})
		if r.hi != ^uint32(0) {
			out = append(out, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, r.hi+1), IntervalEnd: true})
		}
	}
	return out
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

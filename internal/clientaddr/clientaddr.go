// Package clientaddr gives the address under which a peer's connections and streams are
// counted by the per-address bounds of the enforcer's listeners and of its RLQS server, so
// that both count one client the same way.
package clientaddr

import (
	"net"
	"net/netip"
)

// Of returns the address a connection from a counts under: its peer's IP, an IPv6 address
// by its /64 (one host's share of a network), the zero Addr when a is not an IP address
// and port.
func Of(a net.Addr) netip.Addr {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	ip := ap.Addr().Unmap()
	if ip.Is6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return ip
}

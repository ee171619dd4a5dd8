package main

import (
	"context"
	"errors"

	"k8s.io/klog/v2"

	"github.com/nodekit-dev/nodekit/rules"
)

// errCleanup is upstream's error when some rules could not be removed.
var errCleanup = errors.New("encountered an error while tearing down rules")

// cleanupModes is upstream's platformCleanup choice of what to remove: the
// rules of every mode but the one about to run, or of every mode with
// --cleanup. nodekit has no ipvs mode and removes no ipvs state (see
// docs/kube-proxy.md).
func cleanupModes(mode string, cleanupAndExit bool) (iptables, nftables bool) {
	return mode != modeIPTables || cleanupAndExit, mode == modeIPTables || cleanupAndExit
}

// platformCleanup removes leftover rules as upstream does before it starts
// (or, with --cleanup, instead of starting), inside the --netns namespace when
// one is given: in each IP family the iptables and ip6tables chains and jump
// rules of kube-proxy's iptables mode (rules.IPTables.Cleanup), and the
// `ip kube-proxy` and `ip6 kube-proxy` tables of its nftables mode
// (rules.NFTables.Cleanup). A family whose tools or kernel support are missing
// is skipped, as upstream's best-effort clients skip it. Failures are logged
// with upstream's messages where they happen and make it return errCleanup.
func platformCleanup(ctx context.Context, o *options) error {
	doIPTables, doNFTables := cleanupModes(string(o.cfg.Mode), o.cleanupAndExit)
	do := func(fn func() error) error { return fn() }
	if o.netns != "" {
		ns, err := startNSRunner(o.netns)
		if err != nil {
			return err
		}
		defer ns.Close()
		do = ns.Do
	}
	failed := false
	_ = do(func() error {
		families := []rules.Family{rules.IPv4, rules.IPv6}
		if doIPTables {
			for _, f := range families {
				failed = cleanupIPTables(ctx, f) || failed
			}
		}
		if doNFTables {
			for _, f := range families {
				failed = cleanupNFTables(ctx, f) || failed
			}
		}
		return nil
	})
	if failed {
		return errCleanup
	}
	return nil
}

// cleanupIPTables removes one family's iptables leftovers; it reports whether
// that failed. It runs in the rules' namespace.
func cleanupIPTables(ctx context.Context, f rules.Family) bool {
	w, err := rules.NewIPTables(ctx, rules.IPTablesConfig{Family: f})
	if err != nil {
		klog.FromContext(ctx).V(4).Info("No iptables to clean up for family", "ipFamily", f, "err", err.Error())
		return false
	}
	return w.Cleanup(ctx) != nil
}

// cleanupNFTables removes one family's nftables table; it reports whether that
// failed. It runs in the rules' namespace.
func cleanupNFTables(ctx context.Context, f rules.Family) bool {
	w, err := rules.NewNFTables(rules.NFTablesConfig{Family: f})
	if err != nil {
		klog.FromContext(ctx).V(4).Info("No nftables to clean up for family", "ipFamily", f, "err", err.Error())
		return false
	}
	return w.Cleanup(ctx) != nil
}

package main

import (
	"cmp"
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// serviceCIDRWatch follows the cluster's networking.k8s.io/v1 ServiceCIDR objects
// (upstream's config.ServiceCIDRConfig, started since the MultiCIDRServiceAllocator
// gate is locked on): it hands the union of their spec.cidrs to onChange after the
// initial list and whenever the union changes. Upstream keeps a set it inserts
// into and deletes from per event, so a CIDR two objects share leaves with the
// first of them; the union is recomputed from the cache here, so it stays until
// the last one goes.
type serviceCIDRWatch struct {
	informer cache.SharedIndexInformer
	onChange func([]netip.Prefix)

	mu     sync.Mutex
	synced bool
	last   []netip.Prefix
}

func newServiceCIDRWatch(client kubernetes.Interface, resync time.Duration, onChange func([]netip.Prefix)) *serviceCIDRWatch {
	inf := networkinginformers.NewServiceCIDRInformer(client, resync, cache.Indexers{})
	w := &serviceCIDRWatch{informer: inf, onChange: onChange}
	update := func(any) { w.update(false) }
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    update,
		UpdateFunc: func(_, n any) { update(n) },
		DeleteFunc: update,
	})
	return w
}

// run watches until ctx ends.
func (w *serviceCIDRWatch) run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting serviceCIDR config controller")
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.informer.RunWithContext(ctx)
	}()
	defer func() { <-done }()
	if !cache.WaitForNamedCacheSync("serviceCIDR config", ctx.Done(), w.informer.HasSynced) {
		return nil
	}
	w.update(true)
	<-ctx.Done()
	return nil
}

// update recomputes the union and reports it when it changed (and, once, when the
// initial list is in, even if empty).
func (w *serviceCIDRWatch) update(initial bool) {
	// Held throughout, so two reports never overtake each other.
	w.mu.Lock()
	defer w.mu.Unlock()
	var cidrs []netip.Prefix
	for _, obj := range w.informer.GetStore().List() {
		sc, ok := obj.(*networkingv1.ServiceCIDR)
		if !ok {
			continue
		}
		for _, s := range sc.Spec.CIDRs {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				// The API server validates spec.cidrs; a bad one is left out.
				klog.Background().Error(err, "Ignoring invalid CIDR of a ServiceCIDR", "serviceCIDR", klog.KObj(sc), "cidr", s)
				continue
			}
			cidrs = append(cidrs, p.Masked())
		}
	}
	slices.SortFunc(cidrs, comparePrefix)
	cidrs = slices.Compact(cidrs)
	if initial {
		w.synced = true
	} else if !w.synced || slices.Equal(cidrs, w.last) {
		return
	}
	w.last = cidrs
	w.onChange(cidrs)
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// serviceCIDRSetter is the writer that drops traffic to unallocated addresses of
// the service CIDRs (rules.NFTables; upstream's iptables proxier ignores them).
type serviceCIDRSetter interface {
	SetServiceCIDRs([]netip.Prefix) error
}

// OnServiceCIDRsChanged gives each family's writer the CIDRs of its family and
// queues a sync, which rewrites the drop rules even when no Service changed
// (upstream's proxier applies them at its next full sync).
func (p *proxier) OnServiceCIDRsChanged(logger klog.Logger, cidrs []netip.Prefix) {
	queued := false
	for _, f := range p.families {
		s, ok := f.Syncer.(serviceCIDRSetter)
		if !ok {
			continue
		}
		var mine []netip.Prefix
		for _, c := range cidrs {
			if isFamily(c.Addr(), f.Family) {
				mine = append(mine, c)
			}
		}
		if err := s.SetServiceCIDRs(mine); err != nil {
			logger.Error(err, "Cannot use the service CIDRs", "ipFamily", f.Family, "cidrs", mine)
			continue
		}
		logger.V(2).Info("Service CIDRs changed", "ipFamily", f.Family, "cidrs", mine)
		queued = true
	}
	if queued {
		p.changed()
	}
}

package main

import (
	"context"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	certinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// watchPodCertificateRequests wakes a pod's worker whenever one of its
// PodCertificateRequests changes, so an issued (or denied) certificate reaches
// its podCertificate volume at once instead of at the next retry, as upstream's
// podcertificate manager queues the pod's projections on the same events. The
// Node authorizer lets a node list and watch only the requests naming it.
func (m *podManager) watchPodCertificateRequests(ctx context.Context) {
	inf := certinformers.NewFilteredPodCertificateRequestInformer(m.cfg.client, metav1.NamespaceAll, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", m.cfg.nodeName).String()
	})
	wake := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if pcr, ok := obj.(*certificatesv1.PodCertificateRequest); ok {
			m.wakePod(pcr.Spec.PodUID)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    wake,
		UpdateFunc: func(_, obj any) { wake(obj) },
		DeleteFunc: wake,
	}); err != nil {
		klog.ErrorS(err, "Failed to watch the PodCertificateRequests of this node")
		return
	}
	inf.RunWithContext(ctx)
}

package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
)

// kubeProxyComponent is the reporting controller of the agent's events, as
// upstream's recorder names it.
const kubeProxyComponent = "kube-proxy"

// startEvents is upstream's event recorder: events.k8s.io/v1 Events written
// until ctx ends; stop flushes and stops the broadcaster.
func startEvents(ctx context.Context, client kubernetes.Interface) (rec events.EventRecorder, stop func(), err error) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	if err := b.StartRecordingToSinkWithContext(ctx); err != nil {
		return nil, nil, err
	}
	return b.NewRecorder(scheme.Scheme, kubeProxyComponent), b.Shutdown, nil
}

// nodeRef is the Node the agent's own events are about.
func nodeRef(name string) *v1.ObjectReference {
	return &v1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: name}
}

package cri

import (
	"context"
	"errors"
	"fmt"

	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Reasons of the node's Ready condition, as the kubelet writes them.
const (
	ReasonReady    = "KubeletReady"
	ReasonNotReady = "KubeletNotReady"
	// MessageReady is the kubelet's message for a Ready node.
	MessageReady = "kubelet is posting ready status"
	// MessageRuntimeDown is what the kubelet reports once the runtime's Status call has
	// failed for longer than its sync threshold; Readiness reports it for a failed call.
	MessageRuntimeDown = "container runtime is down"
)

// Readiness is the verdict the kubelet draws from the runtime's Status for the node's
// Ready condition.
type Readiness struct {
	// Ready is true when RuntimeReady and NetworkReady are both true.
	Ready bool
	// RuntimeReady and NetworkReady are the runtime's two conditions (false when absent).
	RuntimeReady bool
	NetworkReady bool
	// Reason is ReasonReady or ReasonNotReady.
	Reason string
	// Message is the Ready condition's message in the kubelet's exact words, e.g.
	// "container runtime network not ready: NetworkReady=false
	// reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not
	// initialized". With both conditions false both messages appear, runtime first,
	// joined as the kubelet's error aggregate does: "[a, b]".
	Message string
}

// ReadinessFromStatus draws the verdict from a runtime Status. A nil status counts as
// both conditions missing.
func ReadinessFromStatus(st *runtimeapi.RuntimeStatus) Readiness {
	var runtimeCond, networkCond *runtimeapi.RuntimeCondition
	for _, c := range st.GetConditions() {
		switch c.GetType() {
		case runtimeapi.RuntimeReady:
			runtimeCond = c
		case runtimeapi.NetworkReady:
			networkCond = c
		}
	}
	r := Readiness{RuntimeReady: runtimeCond.GetStatus(), NetworkReady: networkCond.GetStatus()}
	// The kubelet collects runtime errors before network errors.
	var errs []error
	if !r.RuntimeReady {
		errs = append(errs, fmt.Errorf("container runtime not ready: %s", conditionString(runtimeCond)))
	}
	if !r.NetworkReady {
		errs = append(errs, fmt.Errorf("container runtime network not ready: %s", conditionString(networkCond)))
	}
	if agg := utilerrors.NewAggregate(errs); agg != nil {
		r.Reason, r.Message = ReasonNotReady, agg.Error()
		return r
	}
	r.Ready, r.Reason, r.Message = true, ReasonReady, MessageReady
	return r
}

// conditionString formats a condition as the kubelet's RuntimeCondition.String does;
// a missing condition prints as "<nil>", as the kubelet's %v of a nil pointer does.
func conditionString(c *runtimeapi.RuntimeCondition) string {
	if c == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%s=%t reason:%s message:%s", c.GetType(), c.GetStatus(), c.GetReason(), c.GetMessage())
}

// Readiness asks the runtime for its Status and draws the verdict. When the call fails
// the verdict is NotReady with MessageRuntimeDown and the error is returned too.
func (c *Client) Readiness(ctx context.Context) (Readiness, error) {
	st, err := c.Status(ctx)
	if err != nil {
		return Readiness{Reason: ReasonNotReady, Message: MessageRuntimeDown}, err
	}
	return ReadinessFromStatus(st), nil
}

// Err returns the verdict as an error (nil when Ready), for logs and health checks.
func (r Readiness) Err() error {
	if r.Ready {
		return nil
	}
	return errors.New(r.Message)
}

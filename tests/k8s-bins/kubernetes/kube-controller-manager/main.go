// Command kube-controller-manager: the upstream controller manager of the pinned
// k8s.io/kubernetes version (Deployments, ReplicaSets, StatefulSets, DaemonSets,
// garbage collection for the real-node tests), built beside kube-apiserver.
package main

import (
	"os"

	_ "time/tzdata" // CronJob time zones, as upstream

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}

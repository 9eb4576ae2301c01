// Command kube-apiserver: the upstream kube-apiserver command of the pinned
// k8s.io/kubernetes version, built as an ordinary dependency (Go refuses
// `go install k8s.io/kubernetes/cmd/kube-apiserver@...` because that module has
// replace directives). Only the thereabouts tests run it.
package main

import (
	"os"

	_ "time/tzdata" // the official build embeds the time zone database too

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}

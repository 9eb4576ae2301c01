// Command etcd: the etcd server of the pinned go.etcd.io/etcd/server/v3 version.
// A wrapper module is needed because that module's own go.mod has replace
// directives, so `go install go.etcd.io/etcd/server/v3@...` is refused.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

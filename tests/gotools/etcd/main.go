// Command etcd runs etcd's own server entrypoint, so the tests get a real
// etcd at a pinned version without a prebuilt download.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}

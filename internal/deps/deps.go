package main
import (
 _ "github.com/google/nftables"
 _ "github.com/vishvananda/netlink"
 _ "github.com/vishvananda/netns"
 _ "modernc.org/sqlite"
 _ "github.com/creack/pty"
 _ "github.com/fsnotify/fsnotify"
 _ "golang.org/x/sys/unix"
 _ "connectrpc.com/connect"
 _ "google.golang.org/protobuf/proto"
 _ "go.etcd.io/bbolt"
)
func main(){}

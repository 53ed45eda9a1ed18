// probe is what the cluster tests run inside pods:
//
//	probe serve ADDR            answer every HTTP request with this host's name
//	probe get URL [TRIES]       GET URL (resolving its host name), print the body;
//	                            retry once a second, up to TRIES times (default 1)
//	probe resolve NAME          print NAME's addresses
//
// It is built with CGO_ENABLED=0, so names go through Go's own resolver, which
// reads /etc/resolv.conf (search domains, ndots) as the kubelet writes it.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 3 {
		fail("usage: probe serve ADDR | get URL [TRIES] | resolve NAME")
	}
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2])
	case "get":
		tries := 1
		if len(os.Args) > 3 {
			n, err := strconv.Atoi(os.Args[3])
			if err != nil || n < 1 {
				fail("TRIES must be a positive number")
			}
			tries = n
		}
		get(os.Args[2], tries)
	case "resolve":
		addrs, err := net.DefaultResolver.LookupHost(context.Background(), os.Args[2])
		if err != nil {
			fail(err.Error())
		}
		for _, a := range addrs {
			fmt.Println(a)
		}
	default:
		fail("unknown command " + os.Args[1])
	}
}

func serve(addr string) {
	host, _ := os.Hostname()
	srv := &http.Server{Addr: addr, Handler: http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "%s\n", host) })}
	go func() {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
		<-sigs
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	fmt.Printf("serving on %s as %s\n", addr, host)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		fail(err.Error())
	}
}

func get(url string, tries int) {
	client := &http.Client{Timeout: 5 * time.Second}
	var last error
	for i := 0; i < tries; i++ {
		if i > 0 {
			time.Sleep(time.Second)
		}
		resp, err := client.Get(url)
		if err != nil {
			last = err
			fmt.Fprintf(os.Stderr, "try %d: %v\n", i+1, err)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			last = fmt.Errorf("status %d, %v", resp.StatusCode, err)
			fmt.Fprintf(os.Stderr, "try %d: %v\n", i+1, last)
			continue
		}
		os.Stdout.Write(body)
		return
	}
	fail(fmt.Sprintf("%s: %v after %d tries", url, last, tries))
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "probe:", msg)
	os.Exit(1)
}

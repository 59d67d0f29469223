// Command rlqsflood is a hostile RLQS client, for measuring what the enforcer's Rate
// Limit Quota Service holds under it (docs/hardening.md, "Envoys on the Rate Limit Quota
// Service", has the commands and the figures). -mode ids sends 40 000 new bucket ids a
// report on two streams, noread opens -n streams that never read (a normal client on
// 127.0.0.250 reports meanwhile, and its latency is printed), idle opens -n idle streams;
// -srcs spreads the streams over that many source addresses from 127.0.0.2. The enforcer's
// resident memory is read from /proc and its RLQS series from /metrics meanwhile.
//
//	go run ./bench/rlqsflood -addr 127.0.0.1:18083 -mode noread -n 400 -srcs 4 -dur 40s
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"sort"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	addr := flag.String("addr", "", "")
	mode := flag.String("mode", "ids", "ids|idle")
	dur := flag.Duration("dur", 60*time.Second, "")
	n := flag.Int("n", 30000, "idle streams")
	srcs := flag.Int("srcs", 1, "source addresses 127.0.0.2..")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *dur)
	defer cancel()
	switch *mode {
	case "ids":
		done := make(chan int)
		for s := range 2 {
			go func() {
				cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					log.Fatal(err)
				}
				st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
				if err != nil {
					log.Fatal(err)
				}
				go func() {
					for {
						if _, err := st.Recv(); err != nil {
							return
						}
					}
				}()
				next, sent := s*1_000_000_000, 0
				for ctx.Err() == nil {
					m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "api"}
					for range 40000 {
						m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
							BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint(next)}}, NumRequestsAllowed: 1})
						next++
					}
					if st.Send(m) != nil {
						break
					}
					sent++
				}
				done <- sent
			}()
		}
		fmt.Println("reports sent", <-done+<-done)
	case "noread":
		for i := range *n {
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%*srcs))}
			go func() {
				cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
					grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
						return (&net.Dialer{LocalAddr: src}).DialContext(ctx, "tcp", a)
					}))
				if err != nil {
					log.Fatal(err)
				}
				st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
				if err != nil {
					return
				}
				next := i * 1_000_000_000
				for ctx.Err() == nil {
					m := &rlqsv3.RateLimitQuotaUsageReports{Domain: "api"}
					for range 2000 {
						m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
							BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint(next % 2000)}}, NumRequestsAllowed: 1})
						next++
					}
					if st.Send(m) != nil {
						return
					}
				}
			}()
		}
		// A normal client: one bucket, a report every 100 ms, its response latency.
		time.Sleep(5 * time.Second)
		cc, _ := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
				return (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 250)}}).DialContext(ctx, "tcp", a)
			}))
		var lat []time.Duration
		for ctx.Err() == nil {
			st, err := rlqsv3.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
			if err != nil {
				break
			}
			t0 := time.Now()
			if st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "api", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				{BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"user": fmt.Sprint(len(lat))}}, NumRequestsAllowed: 1}}}) != nil {
				continue
			}
			if _, err := st.Recv(); err != nil {
				fmt.Println("normal client error", err)
				continue
			}
			lat = append(lat, time.Since(t0))
			st.CloseSend()
			time.Sleep(100 * time.Millisecond)
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		if len(lat) > 0 {
			fmt.Println("normal client responses", len(lat), "p50", lat[len(lat)/2], "p99", lat[len(lat)*99/100])
		}
	case "idle":
		opened, failed := 0, 0
		for i := 0; opened+failed < *n; i++ {
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%*srcs))}
			cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
					return (&net.Dialer{LocalAddr: src}).DialContext(ctx, "tcp", a)
				}))
			if err != nil {
				log.Fatal(err)
			}
			defer cc.Close() // held open, streams and all, until the run ends
			c := rlqsv3.NewRateLimitQuotaServiceClient(cc)
			for range 200 {
				if _, err := c.StreamRateLimitQuotas(ctx); err != nil {
					failed++
				} else {
					opened++
				}
			}
		}
		fmt.Println("streams opened", opened, "failed", failed)
		<-ctx.Done()
	}
}

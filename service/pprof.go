package service

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// startPprof serves net/http/pprof's handlers on Config.PprofAddr, a
// listener of its own so that profiling is never on the REST address by
// accident. A profile shows the daemon's code paths, and a CPU profile
// costs CPU while it runs, so the address must be loopback unless
// --insecure-listen says every host that can reach it is trusted; with
// --auth-token-file its requests need a token like every other route.
func (s *Server) startPprof() error {
	addr := s.cfg.PprofAddr
	loop, err := isLoopbackAddr(addr)
	if err != nil {
		return fmt.Errorf("--pprof-addr: %w", err)
	}
	if !loop && !s.cfg.InsecureListen {
		return fmt.Errorf("refusing --pprof-addr %s: not a loopback address; profiles show the daemon's internals "+
			"and a CPU profile costs CPU: use 127.0.0.1 (and an SSH tunnel or kubectl port-forward), "+
			"or --insecure-listen if every host that can reach it is trusted", addr)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("pprof listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.pprofLis = lis
	s.doors = append(s.doors, &pprofDoor{lis: lis, srv: &http.Server{
		Handler:           s.auth.HTTPMiddleware(mux),
		ReadHeaderTimeout: 10 * time.Second,
	}})
	return nil
}

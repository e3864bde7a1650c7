package process

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	pb "github.com/cube-dev/cube/api/gen/envd/process"
	"github.com/cube-dev/cube/internal/envd/rpcerr"
	"github.com/cube-dev/cube/internal/errdefs"
)

func (s *Service) input(sel *pb.ProcessSelector, in *pb.ProcessInput) error {
	p, err := s.find(sel)
	if err != nil {
		return err
	}
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Stdin:
		return p.writeInput(v.Stdin, false)
	case *pb.ProcessInput_Pty:
		return p.writeInput(v.Pty, true)
	default:
		return fmt.Errorf("input needs stdin or pty: %w", errdefs.ErrInvalidArgument)
	}
}

// SendInput writes to a process's stdin or PTY.
func (s *Service) SendInput(_ context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	if err := s.input(req.Msg.GetProcess(), req.Msg.GetInput()); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput takes a start event selecting the process, then data events.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var sel *pb.ProcessSelector
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			sel = ev.Start.GetProcess()
			if _, err := s.find(sel); err != nil {
				return nil, rpcerr.From(err)
			}
		case *pb.StreamInputRequest_Data:
			if sel == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the first message must be a start event"))
			}
			if err := s.input(sel, ev.Data.GetInput()); err != nil {
				return nil, rpcerr.From(err)
			}
		case *pb.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("empty stream input event"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// CloseStdin closes a process's stdin (EOF).
func (s *Service) CloseStdin(_ context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if err := p.closeStdin(); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// Update resizes a process's PTY.
func (s *Service) Update(_ context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return nil, rpcerr.From(err)
	}
	if req.Msg.Pty == nil {
		return connect.NewResponse(&pb.UpdateResponse{}), nil
	}
	if err := p.resize(req.Msg.GetPty().GetSize()); err != nil {
		return nil, rpcerr.From(err)
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

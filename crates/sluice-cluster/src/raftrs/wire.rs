//! raft-rs messages on the peer wire (`Request::Raft` of kind
//! `network::kind::RAFTRS`): the body is the bincode of (raft-rs's message
//! in protobuf, as prost encodes it; the commands of its marked entries),
//! with large values by reference (`chunks`), so a value goes from the
//! leader's log to the socket without a copy, and a follower's commands
//! hold slices of the frame they arrived in.
//!
//! Decoding is bounded like every peer message (`network::decode_peer`:
//! no length is trusted beyond the body, the command types are flat) and
//! prost's decoder limits nesting, so a malformed body is an error for
//! that message only, never a panic or an allocation it does not hold.

use super::{Outgoing, RaftMessage};
use crate::network::borrowed::CommandRef;
use crate::network::{decode_peer, encode_chunks};
use crate::types::Command;
use bytes::Bytes;
use sluice_types::SluiceError;

/// The body of `out`'s message, in parts (large values referenced).
pub fn encode(out: &Outgoing) -> Result<Vec<Bytes>, SluiceError> {
    let msg = prost::Message::encode_to_vec(&out.msg);
    let mut values = Vec::new();
    for c in &out.commands {
        crate::chunks::command_values(c, crate::chunks::BY_REFERENCE, &mut values);
    }
    let body: (&[u8], &[Command]) = (&msg, &out.commands);
    encode_chunks(&body, &values).map_err(|e| SluiceError::Internal {
        reason: format!("encoding a raft message: {e}"),
    })
}

/// A raft-rs message and its commands from a peer's body (values are
/// slices of `body`).
pub fn decode(body: &Bytes) -> Result<(RaftMessage, Vec<Command>), SluiceError> {
    let bad = |what: String| SluiceError::protocol(format!("bad raft message: {what}"));
    let (msg, commands): (&[u8], Vec<CommandRef<'_>>) =
        decode_peer(body).map_err(|e| bad(e.to_string()))?;
    let msg = <RaftMessage as prost::Message>::decode(msg).map_err(|e| bad(e.to_string()))?;
    let commands = commands.into_iter().map(|c| c.into_command(body)).collect();
    Ok((msg, commands))
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};

    fn append(values: &[usize]) -> Outgoing {
        let mut msg = RaftMessage {
            to: 2,
            from: 1,
            term: 3,
            log_term: 3,
            index: 10,
            commit: 9,
            ..Default::default()
        };
        msg.set_msg_type(MessageType::MsgAppend);
        let commands: Vec<Command> = values
            .iter()
            .enumerate()
            .map(|(i, &n)| Command::Write {
                key: format!("/v/{i}"),
                value: Some(Bytes::from(vec![i as u8; n])),
                expected: None,
                timestamp_us: 7,
                req_id: None,
                trace: None,
            })
            .collect();
        msg.entries = (0..values.len() as u64)
            .map(|i| Entry {
                term: 3,
                index: 11 + i,
                data: vec![super::super::DATA_COMMAND],
                ..Default::default()
            })
            .collect();
        Outgoing {
            group: 5,
            to: 1,
            msg,
            commands,
        }
    }

    fn joined(parts: Vec<Bytes>) -> Bytes {
        parts.concat().into()
    }

    /// A message and its commands come back as sent; a value the peer
    /// connection would send as a part of its own (from
    /// `chunks::BY_REFERENCE`, 10 KB included) is referenced when encoded (not
    /// copied into the buffer, once per follower) and decoded as a slice
    /// of the received body; a small one is copied.
    #[test]
    fn messages_round_trip_with_large_values_by_reference() {
        let out = append(&[10, 64 * 1024, 3, 10 * 1024]);
        let parts = encode(&out).unwrap();
        let value = |i: usize| match &out.commands[i] {
            Command::Write { value: Some(v), .. } => v.clone(),
            _ => unreachable!(),
        };
        let referenced = |v: &Bytes| parts.iter().any(|p| p.as_ptr() == v.as_ptr());
        assert!(referenced(&value(1)), "the 64 KB value, by reference");
        assert!(referenced(&value(3)), "the 10 KB value, by reference");
        assert!(!referenced(&value(0)), "the 10-byte value is copied");
        let body = joined(parts);
        let (msg, commands) = decode(&body).unwrap();
        assert_eq!(msg, out.msg);
        assert_eq!(commands, out.commands);
        let Command::Write { value: Some(v), .. } = &commands[1] else {
            unreachable!()
        };
        let range = body.as_ptr() as usize..body.as_ptr() as usize + body.len();
        assert!(
            range.contains(&(v.as_ptr() as usize)),
            "a slice of the body"
        );
        // A message without entries (a heartbeat, a vote) has none.
        let mut hb = append(&[]);
        hb.msg.set_msg_type(MessageType::MsgHeartbeat);
        let (msg, commands) = decode(&joined(encode(&hb).unwrap())).unwrap();
        assert_eq!(msg.get_msg_type(), MessageType::MsgHeartbeat);
        assert!(commands.is_empty());
    }

    /// Cut, garbled or random bodies are errors, never panics, and a
    /// claimed length beyond the body allocates nothing.
    #[test]
    fn malformed_bodies_are_errors() {
        let body = joined(encode(&append(&[100, 200])).unwrap());
        for cut in [0, 1, 7, 8, 20, body.len() / 2, body.len() - 1] {
            let e = decode(&body.slice(..cut)).unwrap_err().to_string();
            assert!(e.contains("bad raft message"), "{cut}: {e}");
        }
        // A message length claiming far more than the body holds.
        let mut huge = body.to_vec();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode(&huge.into()).is_err());
        // Bytes that are not protobuf where the message should be.
        let garbage: (&[u8], Vec<Command>) = (&[0xff; 16], Vec::new());
        let b: Bytes = bincode::serialize(&garbage).unwrap().into();
        assert!(decode(&b).is_err());
        // Random bodies: whatever they decode to, no panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..2000 {
            let body: Vec<u8> = (0..(n % 97))
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode(&body.into());
        }
    }
}

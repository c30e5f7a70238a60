//! Learns a substream's protocol from the multistream-select messages our
//! side writes on it: the listener's confirmation (inbound) or the dialer's
//! proposal (outbound). Both are a uvarint length followed by `/proto\n`,
//! after the `/multistream/1.0.0\n` header (and, inbound, any `na\n`).
//!
//! Pure: [`Sniffer::inspect`] looks at the bytes about to be written without
//! consuming them, so the caller can decide (and refuse) before anything of
//! the confirmation reaches the wire.

/// Bytes of negotiation we look at before giving up on a stream.
pub(crate) const MAX_SNIFF_BYTES: usize = 1024;

const HEADER: &[u8] = b"/multistream/1.0.0\n";
const NA: &[u8] = b"na\n";
const LS: &[u8] = b"ls\n";

/// What the bytes written so far (plus the next write) show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seen {
    /// No protocol message yet; keep looking.
    Undecided,
    /// The first protocol message, without its trailing newline.
    Protocol(String),
    /// Not multistream-select, or too long without a protocol: stop looking.
    GiveUp,
}

/// The negotiation bytes our side has written on one substream.
#[derive(Debug, Default)]
pub(crate) struct Sniffer {
    written: Vec<u8>,
}

impl Sniffer {
    /// What the stream would show if `next` were written now.
    pub(crate) fn inspect(&self, next: &[u8]) -> Seen {
        let mut all = Vec::with_capacity(self.written.len() + next.len().min(MAX_SNIFF_BYTES));
        all.extend_from_slice(&self.written);
        all.extend_from_slice(&next[..next.len().min(MAX_SNIFF_BYTES)]);
        scan(&all)
    }

    /// Records that `bytes` were written (no protocol was seen in them).
    pub(crate) fn wrote(&mut self, bytes: &[u8]) {
        let room = MAX_SNIFF_BYTES.saturating_sub(self.written.len());
        self.written
            .extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// Bytes of the listener's answer to a dialer that proposed `protocol` and
/// had it accepted: the header and the protocol echoed, each a uvarint
/// length and the line. What the remote sends after those is its first
/// message of the protocol itself.
pub(crate) fn accepted_reply_len(protocol: &str) -> usize {
    fn line(len: usize) -> usize {
        let mut n = len;
        let mut prefix = 1;
        while n >= 0x80 {
            n >>= 7;
            prefix += 1;
        }
        prefix + len
    }
    line(HEADER.len()) + line(protocol.len() + 1)
}

/// Scans length-prefixed messages from the start of `buf`.
pub(crate) fn scan(buf: &[u8]) -> Seen {
    let mut rest = buf;
    loop {
        let Some((len, used)) = uvarint(rest) else {
            return if rest.len() >= 10 || buf.len() >= MAX_SNIFF_BYTES {
                Seen::GiveUp
            } else {
                Seen::Undecided
            };
        };
        if len == 0 || len > MAX_SNIFF_BYTES {
            return Seen::GiveUp;
        }
        let body = &rest[used..];
        if body.len() < len {
            return if buf.len() >= MAX_SNIFF_BYTES {
                Seen::GiveUp
            } else {
                Seen::Undecided
            };
        }
        let msg = &body[..len];
        rest = &body[len..];
        if msg == HEADER || msg == NA || msg == LS {
            continue;
        }
        return match msg.split_last() {
            Some((b'\n', name)) if name.first() == Some(&b'/') => match std::str::from_utf8(name) {
                Ok(s) => Seen::Protocol(s.to_string()),
                Err(_) => Seen::GiveUp,
            },
            _ => Seen::GiveUp,
        };
    }
}

/// Decodes an unsigned varint: (value, bytes used), or `None` if incomplete.
fn uvarint(buf: &[u8]) -> Option<(usize, usize)> {
    let mut v: usize = 0;
    for (i, b) in buf.iter().enumerate().take(9) {
        v |= usize::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_accepted_reply_is_the_header_and_the_echo() {
        let stop = "/libp2p/circuit/relay/0.2.0/stop";
        let mut reply = msg(HEADER);
        reply.extend(msg(format!("{stop}\n").as_bytes()));
        assert_eq!(accepted_reply_len(stop), reply.len());
        // A protocol name past 127 bytes takes a two-byte length.
        let long = format!("/{}", "x".repeat(200));
        let mut reply = msg(HEADER);
        reply.extend(msg(format!("{long}\n").as_bytes()));
        assert_eq!(accepted_reply_len(&long), reply.len());
    }

    fn msg(m: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut n = m.len();
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(b);
                break;
            }
            out.push(b | 0x80);
        }
        out.extend_from_slice(m);
        out
    }

    #[test]
    fn header_then_confirmation_in_one_write() {
        let mut w = msg(HEADER);
        w.extend(msg(b"/agentmesh/auth/1\n"));
        let s = Sniffer::default();
        assert_eq!(s.inspect(&w), Seen::Protocol("/agentmesh/auth/1".into()));
    }

    #[test]
    fn header_alone_then_na_then_confirmation() {
        let mut s = Sniffer::default();
        let h = msg(HEADER);
        assert_eq!(s.inspect(&h), Seen::Undecided);
        s.wrote(&h);
        let na = msg(NA);
        assert_eq!(s.inspect(&na), Seen::Undecided);
        s.wrote(&na);
        assert_eq!(
            s.inspect(&msg(b"/ipfs/id/1.0.0\n")),
            Seen::Protocol("/ipfs/id/1.0.0".into())
        );
    }

    #[test]
    fn split_message_waits_for_the_rest() {
        let mut s = Sniffer::default();
        let mut w = msg(HEADER);
        w.extend(msg(b"/ipfs/ping/1.0.0\n"));
        let (a, b) = w.split_at(w.len() - 3);
        assert_eq!(s.inspect(a), Seen::Undecided);
        s.wrote(a);
        assert_eq!(s.inspect(b), Seen::Protocol("/ipfs/ping/1.0.0".into()));
    }

    #[test]
    fn garbage_gives_up() {
        assert_eq!(scan(b"\x05hello"), Seen::GiveUp);
        assert_eq!(scan(&msg(b"not a protocol")), Seen::GiveUp);
        assert_eq!(scan(&[0xff; 12]), Seen::GiveUp);
        assert_eq!(scan(&[0x00]), Seen::GiveUp);
    }

    proptest! {
        #[test]
        fn never_panics_and_bounded(bytes in proptest::collection::vec(any::<u8>(), 0..3000)) {
            let mut s = Sniffer::default();
            for chunk in bytes.chunks(37) {
                if s.inspect(chunk) != Seen::Undecided { break; }
                s.wrote(chunk);
                prop_assert!(s.written.len() <= MAX_SNIFF_BYTES);
            }
        }

        #[test]
        fn any_split_finds_the_protocol(name in "/[a-z0-9/._-]{1,60}", cut in 0usize..100) {
            let mut w = msg(HEADER);
            w.extend(msg(format!("{name}\n").as_bytes()));
            let cut = cut.min(w.len());
            let mut s = Sniffer::default();
            let (a, b) = w.split_at(cut);
            let first = s.inspect(a);
            if first == Seen::Undecided {
                s.wrote(a);
                prop_assert_eq!(s.inspect(b), Seen::Protocol(name));
            } else {
                prop_assert_eq!(first, Seen::Protocol(name));
            }
        }
    }
}

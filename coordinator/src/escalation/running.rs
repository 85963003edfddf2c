//! A running host command's task: its output carried to the session's
//! mailbox as signed chunks, in order and within bounds, and its end.
//!
//! Owns everything between a command's start and its reaping: reading its
//! standard output and error as they come, writing each read as a
//! [`MailboxResultChunk`] once the client has made room (at most
//! [`CHUNK_WINDOW`] unread), dropping output past [`MAX_OUTPUT`], ending
//! the command when it is cancelled or the client stops reading, and
//! draining what is left once it exited. Trusts the command for nothing
//! but its bytes; the sandbox only for removing files it has read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lazaret_proto::common::ProtocolVersion;
use lazaret_proto::ids::RequestId;
use lazaret_proto::mailbox::{
    MAX_RESULT_CHUNK, MailboxRecord, MailboxResultChunk, RecordFile, ResultStream, record_file_name,
};
use lazaret_proto::signing::SignError;
use lazaret_proto::trust::SessionBinding;
use tokio::sync::{oneshot, watch};

use super::Escalation;
use super::launch::{END_WAIT, HostCommand, ReapError};
use super::mailbox::SessionMailbox;
use super::report::Ended;
use crate::aio::Stream;

/// The most output bytes of one command that reach the sandbox; past
/// this, output is read and dropped, and the result says so.
pub const MAX_OUTPUT: u64 = 64 * 1024 * 1024;
/// How many result chunks may wait in the mailbox for the client: the
/// command's output then waits in its pipe (backpressure).
pub const CHUNK_WINDOW: u64 = 64;
/// How long a client may leave its output unread before the command is
/// ended.
pub const STALL_LIMIT: Duration = Duration::from_secs(300);
/// How long a cancelled command has between SIGTERM and SIGKILL.
pub const TERM_GRACE: Duration = super::subreaper::TERM_GRACE;
/// How long output may still come after a command exited.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(1);

/// What a finished command left.
#[derive(Debug)]
pub struct Ran {
    /// How the command ended.
    pub ended: Option<Ended>,
    /// How many chunks of its output were written.
    pub chunks: u64,
    /// Whether output past [`MAX_OUTPUT`] was dropped.
    pub truncated: bool,
    /// Why the host ended it, when it did (its output could not be
    /// delivered).
    pub stopped: Option<OutputError>,
}

/// Why a command's output stopped reaching the sandbox (the command is
/// then ended).
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The client left [`CHUNK_WINDOW`] chunks unread too long.
    #[error("the sandbox left the command's output unread for {seconds} s; the command was ended")]
    Stalled {
        /// How long, in seconds.
        seconds: u64,
    },
    /// A chunk could not be signed.
    #[error("cannot sign the command's output")]
    Seal(#[source] SignError),
    /// A chunk could not be written to the mailbox.
    #[error("cannot write the output to the mailbox")]
    Write(#[source] std::io::Error),
}

/// Where a running command's output goes.
#[derive(Debug)]
pub struct Output {
    /// The generation's escalation, whose key signs the chunks.
    pub shared: Arc<Escalation>,
    /// The session's mailbox.
    pub mailbox: Arc<SessionMailbox>,
    /// The session's binding, which every chunk carries.
    pub binding: SessionBinding,
    /// The request whose command it is.
    pub request_id: RequestId,
    /// Bumped as the client removes files from `results/`.
    pub changes: watch::Receiver<u64>,
}

impl Output {
    fn name(&self, sequence: u64) -> String {
        record_file_name(self.request_id, RecordFile::Chunk(sequence))
    }

    /// Waits until chunk `sequence` may be written: the one
    /// [`CHUNK_WINDOW`] before it was read by the client.
    async fn room_for(&mut self, sequence: u64) -> Result<(), OutputError> {
        let Some(oldest) = sequence.checked_sub(CHUNK_WINDOW) else {
            return Ok(());
        };
        let name = self.name(oldest);
        let since = Instant::now();
        while self.mailbox.holds_result(&name) {
            if since.elapsed() > STALL_LIMIT {
                return Err(OutputError::Stalled {
                    seconds: STALL_LIMIT.as_secs(),
                });
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), self.changes.changed()).await;
        }
        Ok(())
    }

    fn put(&self, chunk: MailboxResultChunk) -> Result<(), OutputError> {
        let sequence = chunk.sequence;
        let bytes = self
            .shared
            .signer
            .seal(&MailboxRecord::ResultChunk(chunk))
            .map_err(OutputError::Seal)?;
        self.mailbox
            .put_result(&self.name(sequence), &bytes)
            .map_err(OutputError::Write)
    }
}

/// Reads one stream of a command, or waits forever once it ended.
async fn read_stream(stream: &Option<Stream>, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    match stream {
        Some(stream) => stream.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Runs a command to its end: its output to the mailbox in order, its end
/// by exit, cancellation or a client that stopped reading.
pub async fn run(
    mut command: HostCommand,
    mut output: Output,
    mut cancelled: oneshot::Receiver<()>,
) -> Result<Ran, ReapError> {
    let mut sequence = 0u64;
    let mut offsets = [0u64; 2];
    let mut sent = 0u64;
    let mut truncated = false;
    let mut out_buf = vec![0u8; MAX_RESULT_CHUNK];
    let mut err_buf = vec![0u8; MAX_RESULT_CHUNK];
    let mut exited_at: Option<tokio::time::Instant> = None;
    let mut cancelling = false;
    let mut failure: Option<OutputError> = None;
    loop {
        if command.stdout.is_none() && command.stderr.is_none() && exited_at.is_some() {
            break;
        }
        let drain_over = async {
            match exited_at {
                Some(at) => tokio::time::sleep_until(at + DRAIN_LIMIT).await,
                None => std::future::pending().await,
            }
        };
        let (read, stream) = tokio::select! {
            read = read_stream(&command.stdout, &mut out_buf) => (read, ResultStream::Stdout),
            read = read_stream(&command.stderr, &mut err_buf) => (read, ResultStream::Stderr),
            () = command.exited(), if exited_at.is_none() => {
                // Its launch process has ended whatever the command left.
                exited_at = Some(tokio::time::Instant::now());
                continue;
            }
            _ = &mut cancelled, if !cancelling => {
                cancelling = true;
                // SIGTERM to everything it started, SIGKILL 0.5 s later:
                // its launch process does both. One that does not exit
                // in time is told more bluntly.
                command.cancel();
                let grace = TERM_GRACE + END_WAIT;
                if tokio::time::timeout(grace, command.exited()).await.is_err() {
                    command.end();
                    if tokio::time::timeout(END_WAIT, command.exited()).await.is_err() {
                        command.kill();
                    }
                }
                continue;
            }
            () = drain_over => {
                // Something outside the group still holds a pipe: what it
                // writes from now on is not delivered.
                truncated = true;
                break;
            }
        };
        let index = usize::from(stream == ResultStream::Stderr);
        let n = match read {
            Ok(Some(n)) => n,
            Ok(None) | Err(_) => {
                match stream {
                    ResultStream::Stdout => command.stdout = None,
                    ResultStream::Stderr => command.stderr = None,
                }
                continue;
            }
        };
        // Past the bound nothing more is sent, so what the client gets is
        // a prefix of each stream.
        if truncated || sent + n as u64 > MAX_OUTPUT {
            truncated = true;
            continue;
        }
        if failure.is_some() {
            continue;
        }
        let bytes = if index == 0 {
            &out_buf[..n]
        } else {
            &err_buf[..n]
        };
        let chunk = MailboxResultChunk {
            protocol_version: ProtocolVersion::V1,
            session_binding: output.binding.clone(),
            request_id: output.request_id,
            sequence,
            stream,
            offset: offsets[index],
            bytes: bytes.to_vec(),
        };
        let written = match output.room_for(sequence).await {
            Ok(()) => output.put(chunk),
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                sequence += 1;
                offsets[index] += n as u64;
                sent += n as u64;
            }
            Err(why) => {
                command.end();
                failure = Some(why);
            }
        }
    }
    let ended = command.reap()?;
    Ok(Ran {
        ended: Some(ended),
        chunks: sequence,
        truncated,
        stopped: failure,
    })
}

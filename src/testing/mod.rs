//! Test support that stands in for the network: a fake OpenAI-compatible server.

pub mod fake_openai;

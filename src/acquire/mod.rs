//! Acquiring, for every primitive: the one engine that queues and waits ([`engine`]), what it
//! asks of a primitive ([`primitive`]), and what every acquisition shares ([`wait`]).

pub(crate) mod engine;
pub(crate) mod primitive;
pub(crate) mod wait;

pub(crate) use engine::acquire;
pub(crate) use primitive::{Asked, Left, Primitive};
pub(crate) use wait::{ms, LeaseMode, LeaveFn, Wait, WaitCanceller};

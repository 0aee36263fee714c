"""schedwise: time intervals, recurring events, working days and a task queue."""

from schedwise.agenda import Agenda, Event
from schedwise.interval import Interval, gaps, merge, total_duration
from schedwise.recurrence import Frequency, Recurrence, add_months
from schedwise.taskqueue import EmptyQueueError, PriorityTaskQueue, Task
from schedwise.workdays import WEEKEND, WorkCalendar

__version__ = "0.2.3"

__all__ = [
    "WEEKEND",
    "Agenda",
    "EmptyQueueError",
    "Event",
    "Frequency",
    "Interval",
    "PriorityTaskQueue",
    "Recurrence",
    "Task",
    "WorkCalendar",
    "add_months",
    "gaps",
    "merge",
    "total_duration",
]
